/*
 * vecmath.h -- float math that vectorizes, for kiln's generated kernels.
 *
 * The code generator pastes this header into every kernel it emits. A loop
 * like `for (i = 0; i < n; i++) y[i] = kiln_expf(x[i]);` must become SIMD
 * code under `cc -O3 -march=native`, and a call into libm stops that (GCC
 * vectorizes libm calls only under -ffast-math, which kiln does not use).
 * So every function here is static inline and branch-free: arithmetic, bit
 * casts through a union, comparisons and selects (bit-mask blends, see
 * kiln_vm_sel). Range reduction plus a polynomial, in the style of
 * Cephes and SLEEF:
 *
 *   exp   n = round(x log2 e) by the 1.5*2^23 trick, r = x - n ln2 with ln2
 *         split Cody-Waite (9 + 24 bits), Cephes degree-7 polynomial as
 *         1 + r (1 + r P(r)) in two FMAs, times 2^n built in the exponent
 *         bits in two steps (so results down to the smallest denormal are
 *         right). Overflow -> +inf, underflow -> 0. sigmoid uses exp_core
 *         instead, which splits 1 + r exactly and returns the rounding
 *         error too (slower, 0.78 ulp); tanh uses kiln_expf.
 *   log   x = m 2^e with m in [sqrt(1/2), sqrt(2)); Cephes polynomial in
 *         m - 1; e ln2 added Cody-Waite. Denormals are scaled by 2^23 first.
 *   sin   |x| < 4096 (with FMA): the fast path, all in float: r = x - j pi/2
 *   cos   with pi/2 in three floats, kept as rh + rl (TwoSum, FMA splits).
 *         Else |x| < 2^24: j = round(x 2/pi) and r = x - j pi/2 in double,
 *         pi/2 in three parts (29 + 29 + 53 bits) so each j * part is exact;
 *         |x| >= 2^24: Payne-Hanek style, x = M 2^k and (2^k 2/pi mod 4)
 *         from a 104-entry table in three parts. Every way r is right to
 *         far below a float ulp over the WHOLE float range. Then Cephes
 *         float polynomials for sin and cos on [-pi/4, pi/4] and a quadrant
 *         select. Written branch-free, all paths would run for every
 *         element (most of it in the table gathers), so with
 *         GCC on x86-64 (SSE4.1 and up) sin and cos are vector functions
 *         whose variants (below) take a quick path for a whole vector when
 *         every lane allows it: the fast path with FMA, and without FMA
 *         (no fast path there) the |x| < 2^24 double reduction alone;
 *         other compilers compute all paths and select.
 *   tanh  |x| < 0.625: odd polynomial (accurate near 0, tanh(x) = x for tiny
 *         x); else 1 - 2 / (exp(2|x|) + 1); the sign is copied back.
 *   erf   |x| < 1: x + x R(x^2); 1 <= |x| < 4: 1 - exp(Q(|x|)) with Q a
 *         polynomial fitted to log(erfc), and exp without clamps or the
 *         denormal step (Q is in [-18, -1.8]); |x| >= 4 gives +-1 (erf(3.92)
 *         is already 1.0f). Coefficients fitted for kiln (minimax-like,
 *         mpmath).
 *   gelu  x Phi(x) directly, not 0.5 x (1 + erf(x/sqrt2)): h = Phi(-|x|) =
 *         2^(q - 1) with q = log2(2 Phi(-a)) = a P(a), P a degree-7
 *         polynomial fitted by scripts/fit_gelu.py on [0, 5.5]; 2^(q - 1)
 *         as 2^n times a degree-6 polynomial in r = q - n (n = q rounded);
 *         x - |x| h for x >= 0, x h for x < 0 (h = 0 from |x| = 5.5 on).
 *         Fewer vector operations than the log Phi / exp form it replaced
 *         (docs/decisions.md: gelu in log2 form).
 *   sigmoid  e = exp(-|x|); (x >= 0 ? 1 : e) / (1 + e): no overflow, and
 *         right down to denormal results for large negative x; e is kept in
 *         two parts and the rounding of 1 + e is compensated.
 *   floor, ceil  exact, by the 2^23 rounding trick (GCC vectorizes floorf
 *         only under -fno-trapping-math).
 *
 * NaN in gives NaN out everywhere; kiln_max/kiln_min propagate NaN like
 * torch.maximum/minimum; kiln_relu(NaN) is NaN; odd functions keep -0.
 * kiln_wheref(c, a, b) is torch.where as a blend, and kiln_lt ... kiln_ne,
 * kiln_not give comparisons as 0/1 floats: generated code should use them
 * rather than `?:` or `(float)(a < b)`, which GCC may turn into branches
 * that block vectorization of the whole fused loop.
 * sqrtf and fabsf need nothing from here: under the JIT's -fno-math-errno
 * GCC inlines and vectorizes them. powf is not provided (still libm).
 *
 * Measured max error in ulps of the float result (a correctly rounded
 * function scores 0.5), against libm in double (tests/test_vecmath.c):
 *
 *   function        no FMA, scalar       FMA, vectorized, all 2^32   asserted
 *                   (every 61st float)   (-O3 -march=native, AVX-512)
 *   kiln_expf       1.17                 0.89                        1.5
 *   kiln_logf       0.80                 0.83                        1.0
 *   kiln_sinf       1.57                 1.59                        2.0
 *   kiln_cosf       1.57                 1.58                        2.0
 *   kiln_tanhf      1.31                 1.34                        2.0
 *   kiln_erff       1.39                 1.21                        2.0
 *   kiln_sigmoidf   1.13                 1.15                        1.5
 *   kiln_gelu       1.50 (x >= 0; every  1.52 (x >= 0, at x = 0.21)   2.0
 *                   509th float; Estrin,
 *                   KILN_VM_ESTRIN)
 *                   and for x < 0 absolute: 1.04e-7 (at x = -5.5), asserted
 *                   2^-23; the erf form scores 8.3e-8 there (it cancels)
 *   kiln_floorf, kiln_ceilf: bit-exact (signed zeros too).
 *
 * (exp, sin, cos and erf measured again after the fast paths; tanh, which
 * calls kiln_expf, was not: 1.24 every 1021st float.) Every 61st float at
 * x86-64-v3 (FMA, 8 lanes) and v2 (no FMA, 4 lanes), vectorized, Zen 3:
 * exp 0.887 and 1.171, log 0.777 and 0.800, sin 1.566 and 1.571, cos
 * 1.569 and 1.569, tanh 1.348 and 1.298, erf 1.135 and 1.389, sigmoid
 * 1.108 and 1.134, gelu 1.462 and 1.630 (x >= 0, v2 with Estrin's
 * scheme, 1.701 every 7th float; 1.04e-7 absolute below 0). sin and cos hold their bound over the whole float range, not just
 * near 0: the fast path scores 1.560 (sin) and 1.559 (cos) over every
 * float in [0.5, 4096), and tests/test_vecmath.c also sweeps the floats
 * nearest multiples of pi/2.
 * Speed: bench/vecmath.sh times these functions in kernel-style loops; the
 * figures behind each choice here (the fast paths, the vector variants,
 * gelu's log2 form) are in docs/decisions.md ("vecmath: ..." and "gelu in
 * log2 form").
 *
 * FMA: __builtin_fmaf only where the target has it, else a*b+c (which
 * -std=c11 never contracts), so a build gives the same results scalar or
 * vectorized; with and without FMA both meet the bounds above.
 *
 * Vector variants (GCC on x86-64, SSE4.1 and up: KILN_VM_SIMD): exp, gelu,
 * sigmoid and the sin/cos quick paths also exist as vector functions written in
 * vector operations and GCC's builtins, which GCC calls from vectorized
 * loops under the x86-64 vector function ABI names: 16 lanes with AVX512F
 * and FMA (KILN_VM_AVX512, x86-64-v4; gelu also needs AVX512DQ) in the
 * mask builtins (vrndscaleps, vscalefps, vrangeps, vreduceps,
 * compare-to-mask, masked moves); 8 lanes with AVX2 and FMA
 * (KILN_VM_SIMD8: x86-64-v3, and v4's 8-lane calls) and 4 lanes
 * (x86-64-v2, and the 4-lane calls of v3 and v4, with FMA there) in
 * roundps, blendvps, minps and FMA where the target has it, their
 * constants whole vectors in memory (KILN_VM_CONSTS). GCC compiles the C
 * forms with bit-mask blends and integer exponent arithmetic, in more
 * instructions than the variants take (counts in docs/decisions.md:
 * vecmath: AVX-512 vector variants). Each gives the C function's bits:
 * tests/test_vecmath.c compares them value by value over the sweep and
 * every float of the ranges where it matters, and all 2^32 floats were
 * compared once (exp, gelu, sin, cos, sigmoid; the 16-lane variants, and
 * the 8- and 4-lane ones at v3 and v2 against the C functions vectorized by
 * GCC; not a test: it takes minutes). So the bounds above hold unchanged.
 * Speed: bench/vecmath.sh, and docs/decisions.md for the measurements.
 */
#ifndef KILN_VECMATH_H
#define KILN_VECMATH_H

#include <stdint.h>

#if defined(__GNUC__)
#define KILN_VM_INLINE static inline __attribute__((always_inline))
#else
#define KILN_VM_INLINE static inline
#endif

#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define KILN_VM_FMAF(a, b, c) __builtin_fmaf((a), (b), (c))
#define KILN_VM_ESTRIN 0
#else
#define KILN_VM_FMAF(a, b, c) ((a) * (b) + (c))
/* Without FMA a Horner step is a multiply and an add, twice the latency,
 * and gelu's two polynomials are one dependency chain: there they are
 * evaluated as c + x S(x) with S by Estrin's scheme (powers of x, pairs of
 * terms: three dependent levels instead of six), the C function and its
 * vector variants alike, so they keep each other's bits. The last step
 * stays Horner's, which keeps its accuracy: Estrin all the way raised
 * gelu's error to 1.95 ulp (docs/decisions.md: gelu without FMA: Estrin's
 * scheme). */
#define KILN_VM_ESTRIN 1
#endif

/* ---- bit casts (a union: defined behaviour in C11, and it vectorizes) -- */

KILN_VM_INLINE uint32_t kiln_vm_bits(float f) {
    union { float f; uint32_t u; } c;
    c.f = f;
    return c.u;
}

KILN_VM_INLINE float kiln_vm_float(uint32_t u) {
    union { float f; uint32_t u; } c;
    c.u = u;
    return c.f;
}

KILN_VM_INLINE uint64_t kiln_vm_bits64(double d) {
    union { double d; uint64_t u; } c;
    c.d = d;
    return c.u;
}

/* c ? a : b through bit masks. Both a and b are computed whatever c is;
 * with `?:` GCC may sink the work of one side into a branch, and then not
 * if-convert it back (without -ffast-math a float op may trap, so it is
 * not speculated), and the loop stays scalar. */
KILN_VM_INLINE float kiln_vm_sel(int c, float a, float b) {
    uint32_t m = 0u - (uint32_t)(c != 0);
    return kiln_vm_float((kiln_vm_bits(a) & m) | (kiln_vm_bits(b) & ~m));
}

KILN_VM_INLINE double kiln_vm_sel64(int c, double a, double b) {
    union { double d; uint64_t u; } r;
    uint64_t m = 0u - (uint64_t)(c != 0);
    r.u = (kiln_vm_bits64(a) & m) | (kiln_vm_bits64(b) & ~m);
    return r.d;
}

#define KILN_VM_INF kiln_vm_float(0x7f800000u)
#define KILN_VM_NAN kiln_vm_float(0x7fc00000u)

/* |x| and copysign(mag, sign) by bits. */
KILN_VM_INLINE float kiln_vm_abs(float x) {
    return kiln_vm_float(kiln_vm_bits(x) & 0x7fffffffu);
}

KILN_VM_INLINE float kiln_vm_copysign(float mag, float sign) {
    return kiln_vm_float((kiln_vm_bits(mag) & 0x7fffffffu) |
                         (kiln_vm_bits(sign) & 0x80000000u));
}

/* ---- helpers that ops.def's C forms name ------------------------------ */

/* All selects go through kiln_vm_sel, even these: a `?:` with a constant
 * arm lets GCC thread jumps through the code after it (sin(relu(x)) gets a
 * path where sin(0) is folded), and the duplicated path is not vectorized. */

/* max(x, 0); NaN stays NaN. */
KILN_VM_INLINE float kiln_relu(float x) { return kiln_vm_sel(x < 0.0f, 0.0f, x); }

/* 2^100 for |d| < 2^-100, else 1: generated code divides by a loop-invariant
 * d as (a * s) * (1 / (d * s)) with s = kiln_rcp_scale(d), so 1 / (d s)
 * stays finite wherever a / d is (both products are exact). */
KILN_VM_INLINE float kiln_rcp_scale(float d) {
    return kiln_vm_sel(kiln_vm_abs(d) < 0x1p-100f, 0x1p100f, 1.0f);
}

/* max and min for a reduction that raises its own NaN flag (codegen's
 * inner reductions, which are `omp simd` loops): a NaN may be dropped
 * here, so a plain `?:`, which GCC turns into one vmaxps / vminps (x86's
 * max is exactly acc > v ? acc : v). */
KILN_VM_INLINE float kiln_red_max(float acc, float v) { return acc > v ? acc : v; }
KILN_VM_INLINE float kiln_red_min(float acc, float v) { return acc < v ? acc : v; }

/* torch.maximum / torch.minimum: NaN if either operand is NaN. a's NaN by
 * the select, b's by x86's max itself (a > NaN is false: b), so one
 * compare, a vmaxps and a blend; the same bits as the select of
 * (a > b) | (a != a) it replaced (two compares, an OR and a blend), whose
 * chains made a 3x3 max pool's window kernel 1.6x slower on a Zen 3
 * (docs/decisions.md: Pools: a materialized pad for 3-D and strided padded
 * windows). */
KILN_VM_INLINE float kiln_max(float a, float b) { return kiln_vm_sel(a != a, a, kiln_red_max(a, b)); }

KILN_VM_INLINE float kiln_min(float a, float b) { return kiln_vm_sel(a != a, a, kiln_red_min(a, b)); }

/* Comparisons as 0/1 floats. Not `(float)(a < b)`: GCC turns that into a
 * branch, then sinks the work of a later kiln_wheref into it. */
KILN_VM_INLINE float kiln_lt(float a, float b) { return kiln_vm_sel(a < b, 1.0f, 0.0f); }
KILN_VM_INLINE float kiln_le(float a, float b) { return kiln_vm_sel(a <= b, 1.0f, 0.0f); }
KILN_VM_INLINE float kiln_gt(float a, float b) { return kiln_vm_sel(a > b, 1.0f, 0.0f); }
KILN_VM_INLINE float kiln_ge(float a, float b) { return kiln_vm_sel(a >= b, 1.0f, 0.0f); }
KILN_VM_INLINE float kiln_eq(float a, float b) { return kiln_vm_sel(a == b, 1.0f, 0.0f); }
KILN_VM_INLINE float kiln_ne(float a, float b) { return kiln_vm_sel(a != b, 1.0f, 0.0f); }
KILN_VM_INLINE float kiln_not(float a) { return kiln_vm_sel(a == 0.0f, 1.0f, 0.0f); }

/* torch.where(c, a, b) with c a 0/1 float: both a and b are evaluated (as
 * function arguments), so the choice is a blend, never a branch. */
KILN_VM_INLINE float kiln_wheref(float c, float a, float b) {
    return kiln_vm_sel(c != 0.0f, a, b);
}

/* floor and ceil: GCC vectorizes floorf/ceilf only without -ftrapping-math.
 * Round |x| to an integer by adding and removing 2^23 (exact below 2^23),
 * put the sign back, and step by one where rounding went the wrong way.
 * |x| >= 2^23, inf and NaN are already integral (or NaN): x itself. */
KILN_VM_INLINE float kiln_vm_rint(float x) {
    float a = kiln_vm_abs(x);
    float r = (a + 8388608.0f) - 8388608.0f;
    return kiln_vm_copysign(r, x);
}

KILN_VM_INLINE float kiln_floorf(float x) {
    float r = kiln_vm_rint(x);
    float down = r - 1.0f;
    r = kiln_vm_copysign(kiln_vm_sel(r > x, down, r), x);  /* floor(-0.0) */
    return kiln_vm_sel(kiln_vm_abs(x) < 8388608.0f, r, x);
}

KILN_VM_INLINE float kiln_ceilf(float x) {
    float r = kiln_vm_rint(x);
    float up = r + 1.0f;
    r = kiln_vm_copysign(kiln_vm_sel(r < x, up, r), x);    /* ceil(-0.7) = -0 */
    return kiln_vm_sel(kiln_vm_abs(x) < 8388608.0f, r, x);
}

/* ---- exp --------------------------------------------------------------- */

/* Overflow and underflow thresholds: exp(x) rounds to inf above, to 0 below. */
#define KILN_VM_EXP_HI 88.72283935546875f     /* largest x with exp(x) < 2^128 */
#define KILN_VM_EXP_LO (-103.97283935546875f) /* below: under half the least denormal */

/* 2^n for n in [-150, 128] as p * 2^(n/2) * 2^(n - n/2): each factor is a
 * normal float, and only the last multiply rounds (denormal results). */
KILN_VM_INLINE float kiln_vm_scale(float p, int32_t n) {
    int32_t n1 = n / 2, n2 = n - n1;
    float s1 = kiln_vm_float((uint32_t)(n1 + 127) << 23);
    float s2 = kiln_vm_float((uint32_t)(n2 + 127) << 23);
    return p * s1 * s2;
}

/* (e^r - 1 - r) / r^2 on |r| <= ln2/2 (Cephes expf coefficients). */
KILN_VM_INLINE float kiln_vm_exp_poly(float r) {
    float p = 1.9875691500e-4f;
    p = KILN_VM_FMAF(p, r, 1.3981999507e-3f);
    p = KILN_VM_FMAF(p, r, 8.3334519073e-3f);
    p = KILN_VM_FMAF(p, r, 4.1665795894e-2f);
    p = KILN_VM_FMAF(p, r, 1.6666665459e-1f);
    return KILN_VM_FMAF(p, r, 5.0000001201e-1f);
}

/* e^x = (hi + *lo) 2^*n for x in [-104, 89] (or NaN), hi in [0.7, 1.42].
 * r = rhi + rlo with rhi = x - n C1 exact; e^r = 1 + rhi + (rlo + r^2 P):
 * 1 + rhi is split exactly (Fast2Sum, 1 >= |rhi|), so hi rounds once and
 * stays near 0.5 ulp (not 1), and *lo carries what that rounding lost. */
KILN_VM_INLINE float kiln_vm_exp_core(float x, float *lo, int32_t *n) {
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to int */
    float t = x * 1.44269504088896341f + magic;
    float nf = t - magic;
    *n = (int32_t)(kiln_vm_bits(t) - kiln_vm_bits(magic));
    float rhi = x - nf * 0.693359375f;     /* nf * 0.693359375 is exact */
    float rlo = nf * 2.12194440e-4f;       /* ln2 = C1 - 2.12194440e-4 */
    float r = rhi + rlo;
    float h = 1.0f + rhi;
    float tail = ((1.0f - h) + rhi) + KILN_VM_FMAF(r * r, kiln_vm_exp_poly(r), rlo);
    float hi = h + tail;
    *lo = (h - hi) + tail;
    return hi;
}

/* e^x = p 2^*n, cheaper than exp_core: r = x - n ln2 as there, and
 * p = 1 + r (1 + r P(r)) in two FMAs instead of the compensated sum (the
 * inner rounding is scaled by |r| <= 0.35: 0.89 ulp against 0.78;
 * sigmoid keeps exp_core, whose low part it needs). */
KILN_VM_INLINE float kiln_vm_exp_lean(float x, int32_t *n) {
    const float magic = 12582912.0f;
    float t = x * 1.44269504088896341f + magic;
    float nf = t - magic;
    *n = (int32_t)(kiln_vm_bits(t) - kiln_vm_bits(magic));
    float r = KILN_VM_FMAF(nf, -0.693359375f, x);  /* exact, as in exp_core */
    r = KILN_VM_FMAF(nf, 2.12194440e-4f, r);
    return KILN_VM_FMAF(r, KILN_VM_FMAF(r, kiln_vm_exp_poly(r), 1.0f), 1.0f);
}

KILN_VM_INLINE float kiln_vm_expf(float x) {
    float xc = kiln_vm_sel(x > 89.0f, 89.0f, x);  /* NaN passes both clamps */
    xc = kiln_vm_sel(xc < -104.0f, -104.0f, xc);
    int32_t n;
    float p = kiln_vm_exp_lean(xc, &n);
    float y = kiln_vm_scale(p, n);
    y = kiln_vm_sel(x > KILN_VM_EXP_HI, KILN_VM_INF, y);
    return kiln_vm_sel(x < KILN_VM_EXP_LO, 0.0f, y);
}

/* exp in vector instructions. Written in C (above), GCC compiles exp's
 * clamps and two-step 2^n to compares, blends and integer arithmetic. With
 * AVX-512 the same steps are single instructions: vrndscaleps rounds
 * x log2 e to n (as the 1.5*2^23 trick does), and vscalefps multiplies by
 * 2^n with one rounding, denormal results included (as kiln_vm_scale's two
 * steps do), so the variant below gives the C function's bits exactly in
 * about half the instructions (tests/test_vecmath.c compares the two;
 * docs/decisions.md: vecmath: AVX-512 vector variants). On 4 and 8 lanes
 * (SSE4.1, AVX2; below) roundps does the rounding, and 2^n is an addition
 * to p's exponent bits and a multiply.
 *
 * As for sin and cos (below), the variants are vector functions under the
 * x86-64 vector function ABI names that GCC calls from vectorized loops
 * (_ZGVbN4v_, _ZGVcN8v_, _ZGVdN8v_, _ZGVeN16v_kiln_vm_expf_simd); the
 * scalar symbol runs the C function. With another compiler, off x86-64,
 * below SSE4.1, or where codegen defines KILN_VM_NO_EXP_DISPATCH (in
 * programs without exp or tanh) kiln_expf is the C function. The builtins
 * are GCC's own: including immintrin.h would slow every kernel's compile
 * (docs/decisions.md: vecmath: AVX-512 vector variants). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__AVX512F__) && \
    defined(__FMA__)
/* 16 floats in a zmm register, GCC vector extensions: + - * act per lane
 * exactly as on scalars (and, like them, are not contracted to FMAs under
 * -std=c11); FMA, compare-to-mask and masked move are GCC's builtins. */
#define KILN_VM_AVX512 1
typedef float kiln_vm_f16 __attribute__((vector_size(64)));
typedef uint32_t kiln_vm_u16 __attribute__((vector_size(64)));
typedef int32_t kiln_vm_i16 __attribute__((vector_size(64)));
#define KILN_VM_SPLAT16(c) ((kiln_vm_f16){c, c, c, c, c, c, c, c, c, c, c, c, c, c, c, c})
#define KILN_VM_FMA16(a, b, c) __builtin_ia32_vfmaddps512_mask((a), (b), (c), (uint16_t)-1, 4)
#define KILN_VM_CMP16(a, b, pred) __builtin_ia32_cmpps512_mask((a), (b), (pred), (uint16_t)-1, 4)
/* m ? a : b per lane, m a mask */
#define KILN_VM_SEL16(m, a, b) __builtin_ia32_movaps512_mask((a), (b), (m))
/* kiln_vm_exp_lean's p 2^n on 16 lanes, the same operations: vrndscaleps
 * rounds x log2 e to n as the 1.5*2^23 trick does (imm 8: nearest, no
 * exceptions), vscalefps multiplies by 2^n with one rounding (denormal
 * results too), as kiln_vm_scale's two steps and kiln_vm_exp_erfc's
 * exponent addition do where those are exact. No clamps, no selects. */
KILN_VM_INLINE kiln_vm_f16 kiln_vm_exp16(kiln_vm_f16 x) {
    kiln_vm_f16 nf = __builtin_ia32_rndscaleps_mask(x * 1.44269504088896341f, 8, x, (uint16_t)-1, 4);
    kiln_vm_f16 r = KILN_VM_FMA16(nf, KILN_VM_SPLAT16(-0.693359375f), x);
    r = KILN_VM_FMA16(nf, KILN_VM_SPLAT16(2.12194440e-4f), r);
    kiln_vm_f16 p = KILN_VM_FMA16(KILN_VM_SPLAT16(1.9875691500e-4f), r, KILN_VM_SPLAT16(1.3981999507e-3f));
    p = KILN_VM_FMA16(p, r, KILN_VM_SPLAT16(8.3334519073e-3f));   /* kiln_vm_exp_poly */
    p = KILN_VM_FMA16(p, r, KILN_VM_SPLAT16(4.1665795894e-2f));
    p = KILN_VM_FMA16(p, r, KILN_VM_SPLAT16(1.6666665459e-1f));
    p = KILN_VM_FMA16(p, r, KILN_VM_SPLAT16(5.0000001201e-1f));
    p = KILN_VM_FMA16(r, KILN_VM_FMA16(r, p, KILN_VM_SPLAT16(1.0f)), KILN_VM_SPLAT16(1.0f));
    return __builtin_ia32_scalefps512_mask(p, nf, p, (uint16_t)-1, 4);
}
#else
#define KILN_VM_AVX512 0
#endif

/* 4 and 8 floats in an xmm or ymm register (KILN_VM_SIMD, KILN_VM_SIMD8),
 * GCC vector extensions as above; comparisons give 0 / -1 per lane. Blends
 * are blendvps on the mask's sign bit, rounding is roundps (SSE4.1, imm 8:
 * nearest, no exceptions), and KILN_VM_FMA4 / KILN_VM_FMA8 are vfmaddps
 * where the target has FMA, else a multiply and an add, as KILN_VM_FMAF.
 * The variants exist where GCC may call only variants that can be written
 * here: SSE4.1 (x86-64-v2: b, 4 lanes), AVX (c, 8), AVX2 (d, 8) and
 * AVX-512 with FMA (x86-64-v4: e, 16 lanes, the ones above). 8 lanes are
 * written for AVX2 with FMA (x86-64-v3, v4); without those, c and d run
 * the 4-lane variant twice (KILN_VM_SPLIT8_VARIANT). AVX512F without FMA
 * gets the C functions. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__SSE4_1__) && \
    (!defined(__AVX512F__) || KILN_VM_AVX512)
#define KILN_VM_SIMD 1
typedef float kiln_vm_f4 __attribute__((vector_size(16)));
typedef uint32_t kiln_vm_u4 __attribute__((vector_size(16)));
typedef int32_t kiln_vm_i4 __attribute__((vector_size(16)));
#define KILN_VM_SPLAT4(c) ((kiln_vm_f4){c, c, c, c})
#define KILN_VM_USPLAT4(c) ((kiln_vm_u4){c, c, c, c})
#if defined(__FMA__)
#define KILN_VM_FMA4(a, b, c) __builtin_ia32_vfmaddps((a), (b), (c))
#else
#define KILN_VM_FMA4(a, b, c) ((a) * (b) + (c))
#endif
#define KILN_VM_ROUND4(a) __builtin_ia32_roundps((a), 8)
#define KILN_VM_CVT4(a) __builtin_ia32_cvtps2dq(a)          /* exact on integers */
#define KILN_VM_MIN4(a, b) __builtin_ia32_minps((a), (b))   /* a < b ? a : b */
#define KILN_VM_MAX4(a, b) __builtin_ia32_maxps((a), (b))   /* a > b ? a : b */
#define KILN_VM_BLEND4(a, b, m) __builtin_ia32_blendvps((a), (b), (kiln_vm_f4)(m)) /* m < 0 ? b : a */
#define KILN_VM_ALL4(m) (__builtin_ia32_movmskps((kiln_vm_f4)(m)) == 0xf)
#if defined(__AVX2__) && defined(__FMA__)
#define KILN_VM_SIMD8 1
typedef float kiln_vm_f8 __attribute__((vector_size(32)));
typedef uint32_t kiln_vm_u8 __attribute__((vector_size(32)));
typedef int32_t kiln_vm_i8 __attribute__((vector_size(32)));
#define KILN_VM_SPLAT8(c) ((kiln_vm_f8){c, c, c, c, c, c, c, c})
#define KILN_VM_USPLAT8(c) ((kiln_vm_u8){c, c, c, c, c, c, c, c})
#define KILN_VM_FMA8(a, b, c) __builtin_ia32_vfmaddps256((a), (b), (c))
#define KILN_VM_ROUND8(a) __builtin_ia32_roundps256((a), 8)
#define KILN_VM_CVT8(a) __builtin_ia32_cvtps2dq256(a)
#define KILN_VM_MIN8(a, b) __builtin_ia32_minps256((a), (b))
#define KILN_VM_MAX8(a, b) __builtin_ia32_maxps256((a), (b))
#define KILN_VM_BLEND8(a, b, m) __builtin_ia32_blendvps256((a), (b), (kiln_vm_f8)(m))
#define KILN_VM_ALL8(m) (__builtin_ia32_movmskps256((kiln_vm_f8)(m)) == 0xff)
#else
#define KILN_VM_SIMD8 0
#endif
/* The constants of a 4- or 8-lane function: whole vectors in a static
 * struct (fields ...), read through a pointer k that GCC cannot follow (an
 * empty asm), so each load folds into the instruction that uses it
 * (vfmadd213ps 0x80(%rax), %ymm1, %ymm2) instead of taking a vbroadcastss
 * of its own in every call (docs/decisions.md: vecmath: 8- and 4-lane
 * vector variants). */
#define KILN_VM_CONSTS(k, fields, ...)                                                      \
    static const struct { fields; } k##_table = {__VA_ARGS__};                             \
    const __typeof__(k##_table) *k = &k##_table;                                           \
    __asm__("" : "+r"(k))
/* The variant of fn with N lanes for ISA letter isa under the ABI name
 * sym: kiln_vm_<fn><N>, a vector function below, out of line. */
#define KILN_VM_VARIANT(fn, isa, N, sym)                                                   \
    __attribute__((used, noinline)) static kiln_vm_f##N kiln_vm_##fn##_##isa(kiln_vm_f##N x) \
        __asm__(sym);                                                                      \
    static kiln_vm_f##N kiln_vm_##fn##_##isa(kiln_vm_f##N x) { return kiln_vm_##fn##N(x); }
/* 8 lanes as the 4-lane variant twice (AVX without AVX2 and FMA). */
#define KILN_VM_SPLIT8_VARIANT(fn, isa, sym)                                               \
    typedef float kiln_vm_##fn##_##isa##_t __attribute__((vector_size(32)));              \
    __attribute__((used, noinline)) static kiln_vm_##fn##_##isa##_t                        \
        kiln_vm_##fn##_##isa(kiln_vm_##fn##_##isa##_t x) __asm__(sym);                     \
    static kiln_vm_##fn##_##isa##_t kiln_vm_##fn##_##isa(kiln_vm_##fn##_##isa##_t x) {     \
        union { kiln_vm_##fn##_##isa##_t v; kiln_vm_f4 h[2]; } a = {x};                    \
        a.h[0] = kiln_vm_##fn##_b(a.h[0]);                                                 \
        a.h[1] = kiln_vm_##fn##_b(a.h[1]);                                                 \
        return a.v;                                                                        \
    }
/* The c variant of fn, and the d one where 8 lanes are not written: with
 * KILN_VM_SIMD8, c jumps to kiln_vm_<fn>_d (defined before; GCC calls d
 * there), else each runs the 4-lane variant twice. */
#if KILN_VM_SIMD8
#define KILN_VM_CD_VARIANTS(fn)                                                            \
    __attribute__((used, noinline)) static kiln_vm_f8 kiln_vm_##fn##_c(kiln_vm_f8 x)      \
        __asm__("_ZGVcN8v_kiln_vm_" #fn "_simd");                                          \
    static kiln_vm_f8 kiln_vm_##fn##_c(kiln_vm_f8 x) { return kiln_vm_##fn##_d(x); }
#elif defined(__AVX2__)
#define KILN_VM_CD_VARIANTS(fn)                                                            \
    KILN_VM_SPLIT8_VARIANT(fn, c, "_ZGVcN8v_kiln_vm_" #fn "_simd")                         \
    KILN_VM_SPLIT8_VARIANT(fn, d, "_ZGVdN8v_kiln_vm_" #fn "_simd")
#elif defined(__AVX__)
#define KILN_VM_CD_VARIANTS(fn) KILN_VM_SPLIT8_VARIANT(fn, c, "_ZGVcN8v_kiln_vm_" #fn "_simd")
#else
#define KILN_VM_CD_VARIANTS(fn)
#endif

/* kiln_vm_expf on N lanes (4 or 8), the same operations: the clamps as
 * minps(89, x) and maxps(-104, x) (a NaN x stays NaN), n = x log2 e
 * rounded by roundps (as the 1.5*2^23 trick), p as kiln_vm_exp_lean, and
 * 2^n as (p 2^n2) 2^n1 with n1 = n >> 1 and n2 = n - n1 (kiln_vm_scale
 * halves n toward 0: both factors are normal either way, p 2^n2, an
 * addition to p's exponent bits here, is exact, and the multiply rounds
 * once). The two selects of the C form are left out: past EXP_HI the
 * clamped x gives inf, below EXP_LO 0, as the selects do (every float
 * compared). */
#define KILN_VM_EXPF_N(N)                                                                  \
    KILN_VM_INLINE kiln_vm_f##N kiln_vm_expf##N(kiln_vm_f##N x) {                          \
        KILN_VM_CONSTS(k, kiln_vm_f##N hi; kiln_vm_f##N lo; kiln_vm_f##N log2e; kiln_vm_f##N c1; \
                       kiln_vm_f##N c2; kiln_vm_f##N p[6]; kiln_vm_f##N one,               \
                       KILN_VM_SPLAT##N(89.0f), KILN_VM_SPLAT##N(-104.0f),                 \
                       KILN_VM_SPLAT##N(1.44269504088896341f),                             \
                       KILN_VM_SPLAT##N(-0.693359375f), KILN_VM_SPLAT##N(2.12194440e-4f),  \
                       {KILN_VM_SPLAT##N(1.9875691500e-4f), KILN_VM_SPLAT##N(1.3981999507e-3f), \
                        KILN_VM_SPLAT##N(8.3334519073e-3f), KILN_VM_SPLAT##N(4.1665795894e-2f), \
                        KILN_VM_SPLAT##N(1.6666665459e-1f), KILN_VM_SPLAT##N(5.0000001201e-1f)}, \
                       KILN_VM_SPLAT##N(1.0f));                                            \
        x = KILN_VM_MAX##N(k->lo, KILN_VM_MIN##N(k->hi, x));                               \
        kiln_vm_f##N nf = KILN_VM_ROUND##N(x * k->log2e);                                  \
        kiln_vm_f##N r = KILN_VM_FMA##N(nf, k->c1, x);                                     \
        r = KILN_VM_FMA##N(nf, k->c2, r);                                                  \
        kiln_vm_f##N p = KILN_VM_FMA##N(k->p[0], r, k->p[1]);   /* kiln_vm_exp_poly */     \
        p = KILN_VM_FMA##N(p, r, k->p[2]);                                                 \
        p = KILN_VM_FMA##N(p, r, k->p[3]);                                                 \
        p = KILN_VM_FMA##N(p, r, k->p[4]);                                                 \
        p = KILN_VM_FMA##N(p, r, k->p[5]);                                                 \
        p = KILN_VM_FMA##N(r, KILN_VM_FMA##N(r, p, k->one), k->one);                       \
        kiln_vm_i##N n = KILN_VM_CVT##N(nf), n1 = n >> 1;                                  \
        p = (kiln_vm_f##N)((kiln_vm_u##N)p + ((kiln_vm_u##N)(n - n1) << 23));              \
        return p * (kiln_vm_f##N)(((kiln_vm_u##N)n1 << 23) + (kiln_vm_u##N)k->one);        \
    }
#else
#define KILN_VM_SIMD 0
#define KILN_VM_SIMD8 0
#endif

#if KILN_VM_SIMD && !defined(KILN_VM_NO_EXP_DISPATCH)
#define KILN_VM_EXP_DISPATCH 1
#else
#define KILN_VM_EXP_DISPATCH 0
#endif

#if KILN_VM_EXP_DISPATCH

__attribute__((simd("notinbranch"), const, nothrow, visibility("hidden"))) float kiln_vm_expf_simd(float x);
__attribute__((used, noinline)) static float kiln_vm_expf_1(float x) __asm__("kiln_vm_expf_simd");
static float kiln_vm_expf_1(float x) { return kiln_vm_expf(x); }

KILN_VM_EXPF_N(4)
KILN_VM_VARIANT(expf, b, 4, "_ZGVbN4v_kiln_vm_expf_simd")
#if KILN_VM_SIMD8
KILN_VM_EXPF_N(8)
KILN_VM_VARIANT(expf, d, 8, "_ZGVdN8v_kiln_vm_expf_simd")
#endif
KILN_VM_CD_VARIANTS(expf)
#if KILN_VM_AVX512
__attribute__((used, noinline)) static kiln_vm_f16 kiln_vm_expf_e(kiln_vm_f16 x) __asm__("_ZGVeN16v_kiln_vm_expf_simd");
static kiln_vm_f16 kiln_vm_expf_e(kiln_vm_f16 x) {
    /* No clamps: past the thresholds (inf, NaN from inf - inf, or any
     * value) the two selects at the end decide, and a NaN x stays NaN. */
    kiln_vm_f16 y = kiln_vm_exp16(x);
    y = KILN_VM_SEL16(KILN_VM_CMP16(x, KILN_VM_SPLAT16(KILN_VM_EXP_HI), 0x1e), /* > */
                      KILN_VM_SPLAT16(__builtin_inff()), y);
    return KILN_VM_SEL16(KILN_VM_CMP16(x, KILN_VM_SPLAT16(KILN_VM_EXP_LO), 0x11), /* < */
                         KILN_VM_SPLAT16(0.0f), y);
}
#endif

KILN_VM_INLINE float kiln_expf(float x) { return kiln_vm_expf_simd(x); }
#else
KILN_VM_INLINE float kiln_expf(float x) { return kiln_vm_expf(x); }
#endif

/* ---- log --------------------------------------------------------------- */

/* log(1 + f) - f + f^2/2 on f in [sqrt(1/2) - 1, sqrt(2) - 1], divided by
 * f^3 (Cephes logf). */
KILN_VM_INLINE float kiln_vm_log_poly(float f) {
    float p = 7.0376836292e-2f;
    p = KILN_VM_FMAF(p, f, -1.1514610310e-1f);
    p = KILN_VM_FMAF(p, f, 1.1676998740e-1f);
    p = KILN_VM_FMAF(p, f, -1.2420140846e-1f);
    p = KILN_VM_FMAF(p, f, 1.4249322787e-1f);
    p = KILN_VM_FMAF(p, f, -1.6668057665e-1f);
    p = KILN_VM_FMAF(p, f, 2.0000714765e-1f);
    p = KILN_VM_FMAF(p, f, -2.4999993993e-1f);
    return KILN_VM_FMAF(p, f, 3.3333331174e-1f);
}

KILN_VM_INLINE float kiln_logf(float x) {
    int tiny = x < 1.17549435e-38f;        /* denormal (or <= 0: fixed below) */
    float xbig = x * 8388608.0f;           /* * 2^23 */
    uint32_t u = kiln_vm_bits(kiln_vm_sel(tiny, xbig, x));
    int32_t e = (int32_t)((u >> 23) & 0xffu) - 126 - 23 * tiny;
    float m = kiln_vm_float((u & 0x007fffffu) | 0x3f000000u); /* [0.5, 1) */
    float m2 = m + m;
    int lo = m < 0.70710678118654752f;
    e = e - lo;
    float f = kiln_vm_sel(lo, m2, m) - 1.0f;
    float fe = (float)e, z = f * f;
    float y = kiln_vm_log_poly(f) * f * z;
    y = KILN_VM_FMAF(fe, -2.12194440e-4f, y);
    y = KILN_VM_FMAF(-0.5f, z, y);
    float res = KILN_VM_FMAF(fe, 0.693359375f, f + y);
    res = kiln_vm_sel(x == KILN_VM_INF, KILN_VM_INF, res);
    res = kiln_vm_sel(x == 0.0f, -KILN_VM_INF, res);
    res = kiln_vm_sel(x != x, x, res);
    return kiln_vm_sel(x < 0.0f, KILN_VM_NAN, res);
}

/* ---- sin, cos ----------------------------------------------------------- */

/* sin(r) and cos(r) on |r| <= pi/4 (Cephes sinf/cosf coefficients). */
/* sin(r) = r + r (z P(z)), z = r^2: sin_pz gives z P(z). */
KILN_VM_INLINE float kiln_vm_sin_pz(float z) {
    float p = -1.9515295891e-4f;
    p = KILN_VM_FMAF(p, z, 8.3321608736e-3f);
    p = KILN_VM_FMAF(p, z, -1.6666654611e-1f);
    return p * z;
}

KILN_VM_INLINE float kiln_vm_sin_poly(float r, float z) {
    return KILN_VM_FMAF(kiln_vm_sin_pz(z), r, r);
}

KILN_VM_INLINE float kiln_vm_cos_poly(float z) {
    float p = 2.443315711809948e-5f;
    p = KILN_VM_FMAF(p, z, -1.388731625493765e-3f);
    p = KILN_VM_FMAF(p, z, 4.166664568298827e-2f);
    return KILN_VM_FMAF(p * z, z, KILN_VM_FMAF(-0.5f, z, 1.0f));
}

/* Round a double to an integer (|d| < 2^51) by adding 1.5 * 2^52: the low
 * bits of the sum's representation are then the integer, two's complement. */
#define KILN_VM_MAGIC52 6755399441055744.0

/* Small |x| (< 2^24): j = round(x 2/pi) and r = x - j pi/2 with pi/2 in
 * three parts (29 + 29 + 53 bits): each j * part with |j| < 2^24 is exact.
 * Sets *q = j mod 4, returns r. */
KILN_VM_INLINE double kiln_vm_reduce_small(double d, uint32_t *q) {
    double t = d * 0.63661977236758138 + KILN_VM_MAGIC52;  /* 2/pi */
    double j = t - KILN_VM_MAGIC52;
    *q = (uint32_t)kiln_vm_bits64(t);
    double r = d - j * 1.5707963258028030;      /* 0x1.921fb54p+0 */
    r = r - j * 9.9209357742879870e-10;         /* 0x1.10b4611p-30 */
    return r - j * 2.2517417741562176e-18;      /* 0x1.4c4c6628b80dcp-59 */
}

/* Large |x| (>= 2^24, Payne-Hanek style): x = M 2^k with M the 24-bit
 * integer mantissa and k = exponent - 23 in [1, 104], so x 2/pi mod 4 =
 * M c_k mod 4 for c_k = (2^k 2/pi) mod 4, tabulated in three parts (lsb
 * 2^-26, lsb 2^-54, rest): M c1 and M c2 are exact, and the fraction f
 * comes out with an absolute error near 2^-83. Sets *q, returns f pi/2.
 * Inf and NaN give NaN. Lanes with small |x| read entry 0 (unused). */
KILN_VM_INLINE double kiln_vm_reduce_big(float x, uint32_t *q) {
    static const double c1[104] = {
        0x1.45f306cp+0, 0x1.45f306cp+1, 0x1.17cc1b4p+0, 0x1.17cc1b6p+1,
        0x1.7cc1b7p-2, 0x1.7cc1b7p-1, 0x1.7cc1b7p+0, 0x1.7cc1b72p+1,
        0x1.f306dc8p+0, 0x1.f306dc8p+1, 0x1.e60db92p+1, 0x1.cc1b726p+1,
        0x1.9836e4ep+1, 0x1.306dc9cp+1, 0x1.836e4ep-1, 0x1.836e4e4p+0,
        0x1.836e4e4p+1, 0x1.06dc9c8p+1, 0x1.b7272p-4, 0x1.b72722p-3,
        0x1.b72722p-2, 0x1.b72722p-1, 0x1.b72722p+0, 0x1.b72722p+1,
        0x1.6e4e44p+1, 0x1.b939104p+0, 0x1.b939104p+1, 0x1.727220ap+1,
        0x1.c9c8828p+0, 0x1.c9c882ap+1, 0x1.9391054p+1, 0x1.27220a8p+1,
        0x1.3910548p-1, 0x1.3910548p+0, 0x1.391054ap+1, 0x1.c882a5p-1,
        0x1.c882a5p+0, 0x1.c882a52p+1, 0x1.91054a6p+1, 0x1.220a94ep+1,
        0x1.1054a78p-1, 0x1.1054a7cp+0, 0x1.1054a7ep+1, 0x1.054a7fp-2,
        0x1.054a7fp-1, 0x1.054a7fp+0, 0x1.054a7fp+1, 0x1.529fcp-4,
        0x1.529fc2p-3, 0x1.529fc2p-2, 0x1.529fc2p-1, 0x1.529fc24p+0,
        0x1.529fc26p+1, 0x1.4a7f09cp+0, 0x1.4a7f09cp+1, 0x1.29fc274p+0,
        0x1.29fc274p+1, 0x1.4fe13a8p-1, 0x1.4fe13a8p+0, 0x1.4fe13aap+1,
        0x1.3f84eacp+0, 0x1.3f84eaep+1, 0x1.fc27578p-1, 0x1.fc2757cp+0,
        0x1.fc2757cp+1, 0x1.f84eafap+1, 0x1.f09d5f4p+1, 0x1.e13abe8p+1,
        0x1.c2757dp+1, 0x1.84eafa2p+1, 0x1.09d5f46p+1, 0x1.3abe8ep-3,
        0x1.3abe8fp-2, 0x1.3abe8f8p-1, 0x1.3abe8f8p+0, 0x1.3abe8fap+1,
        0x1.d5f47dp-1, 0x1.d5f47d4p+0, 0x1.d5f47d4p+1, 0x1.abe8fa8p+1,
        0x1.57d1f52p+1, 0x1.5f47d4cp+0, 0x1.5f47d4cp+1, 0x1.7d1f534p+0,
        0x1.7d1f534p+1, 0x1.f47d4dp+0, 0x1.f47d4d2p+1, 0x1.e8fa9a6p+1,
        0x1.d1f534cp+1, 0x1.a3ea69ap+1, 0x1.47d4d36p+1, 0x1.1f534dcp+0,
        0x1.1f534dcp+1, 0x1.f534ddp-2, 0x1.f534dd8p-1, 0x1.f534ddcp+0,
        0x1.f534ddcp+1, 0x1.ea69bb8p+1, 0x1.d4d377p+1, 0x1.a9a6eep+1,
        0x1.534ddcp+1, 0x1.4d377p+0, 0x1.4d37702p+1, 0x1.34ddc0cp+0,
    };
    static const double c2[104] = {
        0x1.c9c8828p-28, 0x1.c9c882ap-27, 0x1.9391054p-27, 0x1.27220a8p-27,
        0x1.3910548p-29, 0x1.3910548p-28, 0x1.391054ap-27, 0x1.c882a5p-29,
        0x1.c882a5p-28, 0x1.c882a52p-27, 0x1.91054a6p-27, 0x1.220a94ep-27,
        0x1.1054a78p-29, 0x1.1054a7cp-28, 0x1.1054a7ep-27, 0x1.054a7fp-30,
        0x1.054a7fp-29, 0x1.054a7fp-28, 0x1.054a7fp-27, 0x1.529fcp-32,
        0x1.529fc2p-31, 0x1.529fc2p-30, 0x1.529fc2p-29, 0x1.529fc24p-28,
        0x1.529fc26p-27, 0x1.4a7f09cp-28, 0x1.4a7f09cp-27, 0x1.29fc274p-28,
        0x1.29fc274p-27, 0x1.4fe13a8p-29, 0x1.4fe13a8p-28, 0x1.4fe13aap-27,
        0x1.3f84eacp-28, 0x1.3f84eaep-27, 0x1.fc27578p-29, 0x1.fc2757cp-28,
        0x1.fc2757cp-27, 0x1.f84eafap-27, 0x1.f09d5f4p-27, 0x1.e13abe8p-27,
        0x1.c2757dp-27, 0x1.84eafa2p-27, 0x1.09d5f46p-27, 0x1.3abe8ep-31,
        0x1.3abe8fp-30, 0x1.3abe8f8p-29, 0x1.3abe8f8p-28, 0x1.3abe8fap-27,
        0x1.d5f47dp-29, 0x1.d5f47d4p-28, 0x1.d5f47d4p-27, 0x1.abe8fa8p-27,
        0x1.57d1f52p-27, 0x1.5f47d4cp-28, 0x1.5f47d4cp-27, 0x1.7d1f534p-28,
        0x1.7d1f534p-27, 0x1.f47d4dp-28, 0x1.f47d4d2p-27, 0x1.e8fa9a6p-27,
        0x1.d1f534cp-27, 0x1.a3ea69ap-27, 0x1.47d4d36p-27, 0x1.1f534dcp-28,
        0x1.1f534dcp-27, 0x1.f534ddp-30, 0x1.f534dd8p-29, 0x1.f534ddcp-28,
        0x1.f534ddcp-27, 0x1.ea69bb8p-27, 0x1.d4d377p-27, 0x1.a9a6eep-27,
        0x1.534ddcp-27, 0x1.4d377p-28, 0x1.4d37702p-27, 0x1.34ddc0cp-28,
        0x1.34ddc0cp-27, 0x1.a6ee068p-29, 0x1.a6ee06cp-28, 0x1.a6ee06cp-27,
        0x1.4ddc0dap-27, 0x1.377036cp-28, 0x1.377036cp-27, 0x1.bb81b68p-29,
        0x1.bb81b6cp-28, 0x1.bb81b6cp-27, 0x1.77036d8p-27, 0x1.dc0db6p-28,
        0x1.dc0db62p-27, 0x1.b81b6c4p-27, 0x1.7036d8ap-27, 0x1.c0db628p-28,
        0x1.c0db628p-27, 0x1.81b6c52p-27, 0x1.036d8a4p-27, 0x1.b6c528p-33,
        0x1.b6c528p-32, 0x1.b6c52ap-31, 0x1.b6c52bp-30, 0x1.b6c52bp-29,
        0x1.b6c52bp-28, 0x1.b6c52b2p-27, 0x1.6d8a566p-27, 0x1.b629598p-28,
    };
    static const double c3[104] = {
        0x1.29fc2757d1f53p-55, 0x1.4fe13abe8fa9ap-57, 0x1.4fe13abe8fa9ap-56,
        0x1.4fe13abe8fa9ap-55, 0x1.3f84eafa3ea6ap-56, 0x1.3f84eafa3ea6ap-55,
        0x1.fc2757d1f534ep-57, 0x1.fc2757d1f534ep-56, 0x1.fc2757d1f534ep-55,
        0x1.f84eafa3ea69cp-55, 0x1.f09d5f47d4d37p-55, 0x1.e13abe8fa9a6fp-55,
        0x1.c2757d1f534dep-55, 0x1.84eafa3ea69bcp-55, 0x1.09d5f47d4d377p-55,
        0x1.3abe8fa9a6eep-59, 0x1.3abe8fa9a6eep-58, 0x1.3abe8fa9a6eep-57,
        0x1.3abe8fa9a6eep-56, 0x1.3abe8fa9a6eep-55, 0x1.d5f47d4d37703p-57,
        0x1.d5f47d4d37703p-56, 0x1.d5f47d4d37703p-55, 0x1.abe8fa9a6ee07p-55,
        0x1.57d1f534ddc0ep-55, 0x1.5f47d4d377037p-56, 0x1.5f47d4d377037p-55,
        0x1.7d1f534ddc0dbp-56, 0x1.7d1f534ddc0dbp-55, 0x1.f47d4d377036ep-56,
        0x1.f47d4d377036ep-55, 0x1.e8fa9a6ee06dbp-55, 0x1.d1f534ddc0db6p-55,
        0x1.a3ea69bb81b6cp-55, 0x1.47d4d377036d9p-55, 0x1.1f534ddc0db63p-56,
        0x1.1f534ddc0db63p-55, 0x1.f534ddc0db629p-58, 0x1.f534ddc0db629p-57,
        0x1.f534ddc0db629p-56, 0x1.f534ddc0db629p-55, 0x1.ea69bb81b6c53p-55,
        0x1.d4d377036d8a5p-55, 0x1.a9a6ee06db14bp-55, 0x1.534ddc0db6296p-55,
        0x1.4d377036d8a56p-56, 0x1.4d377036d8a56p-55, 0x1.34ddc0db6295ap-56,
        0x1.34ddc0db6295ap-55, 0x1.a6ee06db14acdp-57, 0x1.a6ee06db14acdp-56,
        0x1.a6ee06db14acdp-55, 0x1.4ddc0db629599p-55, 0x1.377036d8a5665p-56,
        0x1.377036d8a5665p-55, 0x1.bb81b6c52b328p-57, 0x1.bb81b6c52b328p-56,
        0x1.bb81b6c52b328p-55, 0x1.77036d8a5664fp-55, 0x1.dc0db6295993cp-56,
        0x1.dc0db6295993cp-55, 0x1.b81b6c52b3279p-55, 0x1.7036d8a5664f1p-55,
        0x1.c0db6295993c4p-56, 0x1.c0db6295993c4p-55, 0x1.81b6c52b32788p-55,
        0x1.036d8a5664f11p-55, 0x1.b6c52b3278872p-61, 0x1.b6c52b3278872p-60,
        0x1.b6c52b3278872p-59, 0x1.b6c52b3278872p-58, 0x1.b6c52b3278872p-57,
        0x1.b6c52b3278872p-56, 0x1.b6c52b3278872p-55, 0x1.6d8a5664f10e4p-55,
        0x1.b6295993c439p-56, 0x1.b6295993c439p-55, 0x1.6c52b32788721p-55,
        0x1.b14acc9e21c82p-56, 0x1.b14acc9e21c82p-55, 0x1.6295993c43904p-55,
        0x1.8a5664f10e41p-56, 0x1.8a5664f10e41p-55, 0x1.14acc9e21c821p-55,
        0x1.4acc9e21c821p-58, 0x1.4acc9e21c821p-57, 0x1.4acc9e21c821p-56,
        0x1.4acc9e21c821p-55, 0x1.2b3278872084p-56, 0x1.2b3278872084p-55,
        0x1.5993c439041fep-57, 0x1.5993c439041fep-56, 0x1.5993c439041fep-55,
        0x1.664f10e4107f9p-56, 0x1.664f10e4107f9p-55, 0x1.993c439041fe5p-56,
        0x1.993c439041fe5p-55, 0x1.3278872083fcap-55, 0x1.93c439041fe51p-57,
        0x1.93c439041fe51p-56, 0x1.93c439041fe51p-55, 0x1.278872083fca3p-55,
        0x1.3c439041fe516p-57, 0x1.3c439041fe516p-56,
    };
    uint32_t u = kiln_vm_bits(x);
    /* table index k - 1; 64-bit, as GCC 12 gathers doubles only with
     * 64-bit indices */
    int64_t k = (int64_t)((u >> 23) & 0xffu) - 151;
    k = k < 0 ? 0 : k;
    k = k > 103 ? 103 : k;
    double m = (double)(int32_t)((u & 0x7fffffu) | 0x800000u);
    double v = m * c1[k];
    double t1 = v - 4.0 * ((v * 0.25 + KILN_VM_MAGIC52) - KILN_VM_MAGIC52);
    double t2 = m * c2[k];
    double jt = (t1 + t2) + KILN_VM_MAGIC52;
    double j = jt - KILN_VM_MAGIC52;
    double f = ((t1 - j) + t2) + m * c3[k];
    uint32_t qb = (uint32_t)kiln_vm_bits64(jt);
    int neg = x < 0.0f;
    *q = (qb ^ (0u - (uint32_t)neg)) + (uint32_t)neg;  /* neg ? -qb : qb */
    f = kiln_vm_sel64(neg, -f, f);
    return f * 1.5707963267948966 + (double)(x * 0.0f); /* inf, NaN: NaN */
}

/* sin(x + q0 pi/2) for any float x: q0 = 0 gives sin, q0 = 1 gives cos. */
KILN_VM_INLINE float kiln_vm_sincos_any(float x, uint32_t q0) {
    uint32_t qs, qb;
    double rs = kiln_vm_reduce_small((double)x, &qs);
    double rb = kiln_vm_reduce_big(x, &qb);
    int small = kiln_vm_abs(x) < 16777216.0f;
    float r = (float)kiln_vm_sel64(small, rs, rb), z = r * r;
    uint32_t ms = 0u - (uint32_t)small;
    uint32_t q = ((qs & ms) | (qb & ~ms)) + q0;
    float s = kiln_vm_sin_poly(r, z), c = kiln_vm_cos_poly(z);
    float y = kiln_vm_sel((int)(q & 1u), c, s);
    return kiln_vm_float(kiln_vm_bits(y) ^ ((q & 2u) << 30));
}

/* The per-vector dispatch below: GCC on x86-64 with the vector variants
 * (KILN_VM_SIMD). The fast path needs FMA too; elsewhere it is not
 * compiled (selected per lane, it would only add its cost to the full
 * path's). */
#if KILN_VM_SIMD && !defined(KILN_VM_NO_TRIG_DISPATCH)
#define KILN_VM_TRIG_DISPATCH 1
#else
#define KILN_VM_TRIG_DISPATCH 0
#endif

#if KILN_VM_TRIG_DISPATCH && defined(__FMA__)
/* The fast path, for |x| < KILN_VM_TRIG_FAST, in float only (no double, no
 * table): j = round(x 2/pi) < 2^12, and r = x - j pi/2 as rh + rl with
 * pi/2 = C1 + C2 + C3 (24 + 24 + 24 bits, the rest is 2^-76). x - j C1 is
 * exact (a multiple of 2^-24 below 1), j C2 is split exactly by an FMA and
 * subtracted by TwoSum, so rh + rl is right to about 2^-64, far below a
 * float ulp of the smallest r there (2^-28, at x = 252.898..). The
 * polynomials take rl as a first-order correction. Needs a real FMA. */
#define KILN_VM_TRIG_FAST 4096.0f

KILN_VM_INLINE float kiln_vm_sincos_fast(float x, uint32_t q0) {
    const float magic = 12582912.0f, c2 = -0x1.777a5cp-25f, c3 = -0x1.ee59dap-50f;
    float t = x * 0.636619772f + magic;
    float j = t - magic;
    uint32_t q = kiln_vm_bits(t) + q0;     /* the low bits of t are j */
    float r1 = KILN_VM_FMAF(j, -0x1.921fb6p+0f, x);
    float p = j * c2, pe = KILN_VM_FMAF(j, c2, -p);
    float rh = r1 - p, b = rh - r1;
    float rl = ((r1 - (rh - b)) - (p + b)) - KILN_VM_FMAF(j, c3, pe);
    float z = rh * rh;
    float s = rh + KILN_VM_FMAF(kiln_vm_sin_pz(z), rh, rl);
    float c = KILN_VM_FMAF(-rh, rl, kiln_vm_cos_poly(z));
    float y = kiln_vm_sel((int)(q & 1u), c, s);
    return kiln_vm_float(kiln_vm_bits(y) ^ ((q & 2u) << 30));
}

/* Both paths, selected per lane: the fast one where it applies, so a
 * value's result never depends on its neighbours in a vector. */
KILN_VM_INLINE float kiln_vm_sincos(float x, uint32_t q0) {
    float f = kiln_vm_sincos_fast(x, q0);
    return kiln_vm_sel(kiln_vm_abs(x) < KILN_VM_TRIG_FAST, f, kiln_vm_sincos_any(x, q0));
}
#else
KILN_VM_INLINE float kiln_vm_sincos(float x, uint32_t q0) { return kiln_vm_sincos_any(x, q0); }
#endif

/* The select keeps sin(-0) = -0 (the polynomial would give +0). */
KILN_VM_INLINE float kiln_vm_sinf(float x) {
    float y = kiln_vm_sincos(x, 0u);
    return kiln_vm_sel(x == 0.0f, x, y);
}
KILN_VM_INLINE float kiln_vm_cosf(float x) { return kiln_vm_sincos(x, 1u); }

/* Per-vector dispatch. A branch in the scalar
 * form cannot skip the large-argument path: inside a vectorized loop or a
 * declare-simd clone GCC needs straight-line code, so both paths run and
 * the three table gathers take most of the time even when no lane needs
 * them (docs/decisions.md: vecmath: per-vector dispatch for sin and cos).
 * So sin and cos are declared `simd` and their vector variants are
 * written here, under the x86-64 vector function ABI names GCC calls
 * (_ZGV<isa>N<lanes>v_<name>, as glibc's libmvec provides them): each
 * checks whether any lane is outside its quick path and, if none is, runs
 * that path in vector operations, inline; else a fixed-length loop
 * (vectorized) of the full function over the lanes. The quick path is the
 * fast one (|x| < KILN_VM_TRIG_FAST) where the target has FMA, and without
 * FMA (x86-64-v2), where the C function has no fast path, the C function's
 * own double reduction for |x| < 2^24 (kiln_vm_reduce_small) without the
 * table path beside it. The scalar symbol is the full function. Only the
 * variants this target can use are defined (GCC calls no other); nothing
 * is left undefined, which tests/vectorize_check.sh checks with nm -u.
 * They are compiled into every kernel, used or not (GCC must not drop
 * them before its vectorizer calls them), so codegen defines
 * KILN_VM_NO_TRIG_DISPATCH in programs without sin or cos and they get
 * the plain definitions below: compiled in, the variants cost compile time
 * (docs/decisions.md: Unused vector variants left out of the prelude). */
#if KILN_VM_TRIG_DISPATCH
/* The full path over KILN_VM_TRIG_N floats (the widest variant's lanes;
 * q0 = 0: sin, 1: cos), out of line, so a kernel compiles it once, not
 * once per variant; a fixed count leaves no remainder loops to compile
 * (inlined per variant, with remainders, such loops cost compile time in
 * every kernel: docs/decisions.md: vecmath: per-vector dispatch for sin
 * and cos). Narrower variants pad with zeros. */
#if KILN_VM_AVX512
#define KILN_VM_TRIG_N 16
#elif KILN_VM_SIMD8
#define KILN_VM_TRIG_N 8
#else
#define KILN_VM_TRIG_N 4
#endif
#define KILN_VM_TRIG_LOOP(name, fn)                                               \
    __attribute__((noinline, noclone)) static void name(const float *restrict x,  \
                                                        float *restrict y, uint32_t q0) { \
        for (int i = 0; i < KILN_VM_TRIG_N; i++) {                                \
            float v = fn(x[i], q0);                                               \
            y[i] = kiln_vm_sel((q0 == 0u) & (x[i] == 0.0f), x[i], v); /* sin(-0) */ \
        }                                                                         \
    }
KILN_VM_TRIG_LOOP(kiln_vm_trig_full, kiln_vm_sincos)

__attribute__((simd("notinbranch"), const, nothrow, visibility("hidden"))) float kiln_vm_sinf_simd(float x);
__attribute__((simd("notinbranch"), const, nothrow, visibility("hidden"))) float kiln_vm_cosf_simd(float x);
__attribute__((used, noinline)) static float kiln_vm_sinf_1(float x) __asm__("kiln_vm_sinf_simd");
__attribute__((used, noinline)) static float kiln_vm_cosf_1(float x) __asm__("kiln_vm_cosf_simd");
static float kiln_vm_trig_1(float x, uint32_t q0) {
    float in[KILN_VM_TRIG_N] = {x}, out[KILN_VM_TRIG_N];
    kiln_vm_trig_full(in, out, q0);
    return out[0];
}
static float kiln_vm_sinf_1(float x) { return kiln_vm_trig_1(x, 0u); }
static float kiln_vm_cosf_1(float x) { return kiln_vm_trig_1(x, 1u); }

/* On N lanes (4 or 8): kiln_vm_sin_pz, kiln_vm_cos_poly and the quadrant
 * select, operation for operation (so the same bits): y = s or c by q's
 * low bit (blendvps on q << 31), negated where q & 2. */
#define KILN_VM_TRIG_POLY_N(N)                                                             \
    KILN_VM_INLINE kiln_vm_f##N kiln_vm_sin_pz##N(kiln_vm_f##N z) {                        \
        KILN_VM_CONSTS(k, kiln_vm_f##N p[3], {KILN_VM_SPLAT##N(-1.9515295891e-4f),         \
                       KILN_VM_SPLAT##N(8.3321608736e-3f), KILN_VM_SPLAT##N(-1.6666654611e-1f)}); \
        return KILN_VM_FMA##N(KILN_VM_FMA##N(k->p[0], z, k->p[1]), z, k->p[2]) * z;        \
    }                                                                                      \
    KILN_VM_INLINE kiln_vm_f##N kiln_vm_cos_poly##N(kiln_vm_f##N z) {                      \
        KILN_VM_CONSTS(k, kiln_vm_f##N p[3]; kiln_vm_f##N half; kiln_vm_f##N one,          \
                       {KILN_VM_SPLAT##N(2.443315711809948e-5f),                           \
                        KILN_VM_SPLAT##N(-1.388731625493765e-3f),                          \
                        KILN_VM_SPLAT##N(4.166664568298827e-2f)},                          \
                       KILN_VM_SPLAT##N(-0.5f), KILN_VM_SPLAT##N(1.0f));                   \
        kiln_vm_f##N p = KILN_VM_FMA##N(KILN_VM_FMA##N(k->p[0], z, k->p[1]), z, k->p[2]);  \
        return KILN_VM_FMA##N(p * z, z, KILN_VM_FMA##N(k->half, z, k->one));               \
    }                                                                                      \
    KILN_VM_INLINE kiln_vm_f##N kiln_vm_quadrant##N(kiln_vm_f##N s, kiln_vm_f##N c,        \
                                                    kiln_vm_u##N q) {                      \
        kiln_vm_f##N y = KILN_VM_BLEND##N(s, c, q << 31);                                  \
        return (kiln_vm_f##N)((kiln_vm_u##N)y ^ ((q >> 1) << 31));  /* (q & 2) << 30 */    \
    }
/* kiln_vm_sincos_fast on N lanes, and sin(-0) = -0 where q0 = 0; j =
 * round(x 2/pi) by roundps, as the 1.5*2^23 trick there (|x 2/pi| <
 * 2^22), and q from j converted (the same low bits as t's). */
#define KILN_VM_SINCOS_FAST_N(N)                                                           \
    KILN_VM_INLINE kiln_vm_f##N kiln_vm_sincos##N(kiln_vm_f##N x, uint32_t q0) {           \
        KILN_VM_CONSTS(k, kiln_vm_f##N twopi; kiln_vm_f##N c1; kiln_vm_f##N c2; kiln_vm_f##N c3, \
                       KILN_VM_SPLAT##N(0.636619772f), KILN_VM_SPLAT##N(-0x1.921fb6p+0f),  \
                       KILN_VM_SPLAT##N(-0x1.777a5cp-25f), KILN_VM_SPLAT##N(-0x1.ee59dap-50f)); \
        kiln_vm_f##N j = KILN_VM_ROUND##N(x * k->twopi);                                   \
        kiln_vm_u##N q = (kiln_vm_u##N)KILN_VM_CVT##N(j) + q0;                             \
        kiln_vm_f##N r1 = KILN_VM_FMA##N(j, k->c1, x);                                     \
        kiln_vm_f##N p = j * k->c2, pe = KILN_VM_FMA##N(j, k->c2, -p);                     \
        kiln_vm_f##N rh = r1 - p, b = rh - r1;                                             \
        kiln_vm_f##N rl = ((r1 - (rh - b)) - (p + b)) - KILN_VM_FMA##N(j, k->c3, pe);      \
        kiln_vm_f##N z = rh * rh;                                                          \
        kiln_vm_f##N s = rh + KILN_VM_FMA##N(kiln_vm_sin_pz##N(z), rh, rl);                \
        kiln_vm_f##N c = KILN_VM_FMA##N(-rh, rl, kiln_vm_cos_poly##N(z));                  \
        kiln_vm_f##N y = kiln_vm_quadrant##N(s, c, q);                                     \
        return q0 ? y : KILN_VM_BLEND##N(y, x, x == KILN_VM_SPLAT##N(0.0f));               \
    }
/* The full loop on one vector of N lanes, out of line (inlined, its
 * copies to memory gave the variant a stack frame). */
#define KILN_VM_TRIG_SLOW_N(N)                                                             \
    __attribute__((noinline, noclone)) static kiln_vm_f##N kiln_vm_trig_slow##N(           \
        kiln_vm_f##N x, uint32_t q0) {                                                     \
        float in[KILN_VM_TRIG_N] = {0}, out[KILN_VM_TRIG_N];                               \
        __builtin_memcpy(in, &x, sizeof x);                                                \
        kiln_vm_trig_full(in, out, q0);                                                    \
        __builtin_memcpy(&x, out, sizeof x);                                               \
        return x;                                                                          \
    }
/* The variant of fn (q0 = 0: sin, 1: cos) with N lanes for ISA letter isa:
 * kiln_vm_sincos<N> where every |x| < lim (a NaN is not), else the full
 * loop. */
#define KILN_VM_TRIG_VARIANT(fn, q0, isa, N, lim, sym)                                     \
    __attribute__((used, noinline)) static kiln_vm_f##N kiln_vm_##fn##_##isa(kiln_vm_f##N x) \
        __asm__(sym);                                                                      \
    static kiln_vm_f##N kiln_vm_##fn##_##isa(kiln_vm_f##N x) {                             \
        KILN_VM_CONSTS(k, kiln_vm_u##N abs; kiln_vm_f##N quick,                            \
                       KILN_VM_USPLAT##N(0x7fffffffu), KILN_VM_SPLAT##N(lim));             \
        kiln_vm_f##N ax = (kiln_vm_f##N)((kiln_vm_u##N)x & k->abs);                        \
        if (__builtin_expect(!KILN_VM_ALL##N(ax < k->quick), 0))                           \
            return kiln_vm_trig_slow##N(x, q0);                                            \
        return kiln_vm_sincos##N(x, q0);                                                   \
    }
KILN_VM_TRIG_POLY_N(4)
#if defined(__FMA__)
KILN_VM_SINCOS_FAST_N(4)
#define KILN_VM_TRIG_QUICK4 KILN_VM_TRIG_FAST
#else
/* Without FMA, on 4 lanes: kiln_vm_sincos_any's small path, operation for
 * operation: kiln_vm_reduce_small on two pairs of doubles (t's low 32 bits
 * are j mod 4 and more), r rounded to float, the polynomials as a multiply
 * and an add each, for |x| < 2^24. */
typedef double kiln_vm_d2 __attribute__((vector_size(16)));
KILN_VM_INLINE kiln_vm_d2 kiln_vm_reduce_small2(kiln_vm_d2 d, kiln_vm_d2 *t) {
    *t = d * 0.63661977236758138 + KILN_VM_MAGIC52;
    kiln_vm_d2 j = *t - KILN_VM_MAGIC52;
    kiln_vm_d2 r = d - j * 1.5707963258028030;
    r = r - j * 9.9209357742879870e-10;
    return r - j * 2.2517417741562176e-18;
}
KILN_VM_INLINE kiln_vm_f4 kiln_vm_sincos4(kiln_vm_f4 x, uint32_t q0) {
    kiln_vm_d2 t0, t1;
    kiln_vm_d2 r0 = kiln_vm_reduce_small2(__builtin_ia32_cvtps2pd(x), &t0);
    kiln_vm_d2 r1 = kiln_vm_reduce_small2(__builtin_ia32_cvtps2pd(__builtin_ia32_movhlps(x, x)), &t1);
    kiln_vm_f4 r = __builtin_ia32_movlhps(__builtin_ia32_cvtpd2ps(r0), __builtin_ia32_cvtpd2ps(r1));
    kiln_vm_u4 q = (kiln_vm_u4)__builtin_ia32_shufps((kiln_vm_f4)t0, (kiln_vm_f4)t1, 0x88) + q0;
    kiln_vm_f4 z = r * r;
    kiln_vm_f4 y = kiln_vm_quadrant4(KILN_VM_FMA4(kiln_vm_sin_pz4(z), r, r), kiln_vm_cos_poly4(z), q);
    return q0 ? y : KILN_VM_BLEND4(y, x, x == KILN_VM_SPLAT4(0.0f));
}
#define KILN_VM_TRIG_QUICK4 16777216.0f
#endif
KILN_VM_TRIG_SLOW_N(4)
KILN_VM_TRIG_VARIANT(sinf, 0u, b, 4, KILN_VM_TRIG_QUICK4, "_ZGVbN4v_kiln_vm_sinf_simd")
KILN_VM_TRIG_VARIANT(cosf, 1u, b, 4, KILN_VM_TRIG_QUICK4, "_ZGVbN4v_kiln_vm_cosf_simd")
#if KILN_VM_SIMD8
KILN_VM_TRIG_POLY_N(8)
KILN_VM_SINCOS_FAST_N(8)
KILN_VM_TRIG_SLOW_N(8)
KILN_VM_TRIG_VARIANT(sinf, 0u, d, 8, KILN_VM_TRIG_FAST, "_ZGVdN8v_kiln_vm_sinf_simd")
KILN_VM_TRIG_VARIANT(cosf, 1u, d, 8, KILN_VM_TRIG_FAST, "_ZGVdN8v_kiln_vm_cosf_simd")
#endif
KILN_VM_CD_VARIANTS(sinf)
KILN_VM_CD_VARIANTS(cosf)
#if KILN_VM_AVX512
/* kiln_vm_sincos_fast on 16 lanes, operation for operation (so the same
 * bits), with mask selects: the C version's selects are bit-mask blends
 * that GCC leaves as 4-6 integer instructions each. q0 = 0: sin (with
 * sin(-0) = -0), 1: cos. */
KILN_VM_INLINE kiln_vm_f16 kiln_vm_sincos_fast16(kiln_vm_f16 x, uint32_t q0) {
    const float magic = 12582912.0f, c2 = -0x1.777a5cp-25f, c3 = -0x1.ee59dap-50f;
    kiln_vm_f16 t = x * 0.636619772f + magic;
    kiln_vm_f16 j = t - magic;
    kiln_vm_u16 q = (kiln_vm_u16)t + q0;
    kiln_vm_f16 r1 = KILN_VM_FMA16(j, KILN_VM_SPLAT16(-0x1.921fb6p+0f), x);
    kiln_vm_f16 p = j * c2, pe = KILN_VM_FMA16(j, KILN_VM_SPLAT16(c2), -p);
    kiln_vm_f16 rh = r1 - p, b = rh - r1;
    kiln_vm_f16 rl = ((r1 - (rh - b)) - (p + b)) - KILN_VM_FMA16(j, KILN_VM_SPLAT16(c3), pe);
    kiln_vm_f16 z = rh * rh;
    kiln_vm_f16 sp = KILN_VM_FMA16(KILN_VM_SPLAT16(-1.9515295891e-4f), z, KILN_VM_SPLAT16(8.3321608736e-3f));
    sp = KILN_VM_FMA16(sp, z, KILN_VM_SPLAT16(-1.6666654611e-1f)) * z;       /* kiln_vm_sin_pz */
    kiln_vm_f16 cp = KILN_VM_FMA16(KILN_VM_SPLAT16(2.443315711809948e-5f), z,
                                   KILN_VM_SPLAT16(-1.388731625493765e-3f));
    cp = KILN_VM_FMA16(cp, z, KILN_VM_SPLAT16(4.166664568298827e-2f));
    cp = KILN_VM_FMA16(cp * z, z, KILN_VM_FMA16(KILN_VM_SPLAT16(-0.5f), z, KILN_VM_SPLAT16(1.0f)));
    kiln_vm_f16 s = rh + KILN_VM_FMA16(sp, rh, rl);
    kiln_vm_f16 c = KILN_VM_FMA16(-rh, rl, cp);
    kiln_vm_i16 q1 = (kiln_vm_i16)(q & 1u);
    uint16_t odd = __builtin_ia32_ptestmd512(q1, q1, (uint16_t)-1);   /* q & 1 != 0 */
    kiln_vm_f16 y = KILN_VM_SEL16(odd, c, s);
    y = (kiln_vm_f16)((kiln_vm_u16)y ^ ((q & 2u) << 30));
    return q0 ? y : KILN_VM_SEL16(KILN_VM_CMP16(x, KILN_VM_SPLAT16(0.0f), 0x00), x, y);
}

/* The 16-lane variant: a mask compare says whether any lane needs the full
 * path; if none does, the fast path runs in registers, inline: no copy to
 * memory and no call, as the copy and 16-float loop of the fast path that
 * the narrower variants used before KILN_VM_TRIG_VARIANT needed
 * (docs/decisions.md: vecmath: per-vector dispatch for sin and cos). */
#define KILN_VM_TRIG_VARIANT16(fn, q0, sym)                                               \
    __attribute__((used, noinline)) static kiln_vm_f16 kiln_vm_##fn##_e(kiln_vm_f16 x)   \
        __asm__(sym);                                                                    \
    static kiln_vm_f16 kiln_vm_##fn##_e(kiln_vm_f16 x) {                                 \
        kiln_vm_f16 ax = (kiln_vm_f16)((kiln_vm_u16)x & 0x7fffffffu);                    \
        if (__builtin_expect(KILN_VM_CMP16(ax, KILN_VM_SPLAT16(KILN_VM_TRIG_FAST), 0x05) != 0, 0)) { \
            union { kiln_vm_f16 v; float f[16]; } a, y; /* 0x05: not <, NaN too */        \
            a.v = x;                                                                     \
            kiln_vm_trig_full(a.f, y.f, q0);                                             \
            return y.v;                                                                  \
        }                                                                                \
        return kiln_vm_sincos_fast16(x, q0);                                             \
    }
KILN_VM_TRIG_VARIANT16(sinf, 0u, "_ZGVeN16v_kiln_vm_sinf_simd")
KILN_VM_TRIG_VARIANT16(cosf, 1u, "_ZGVeN16v_kiln_vm_cosf_simd")
#endif /* AVX512F under KILN_VM_TRIG_DISPATCH (KILN_VM_SIMD) is KILN_VM_AVX512 */

KILN_VM_INLINE float kiln_sinf(float x) { return kiln_vm_sinf_simd(x); }
KILN_VM_INLINE float kiln_cosf(float x) { return kiln_vm_cosf_simd(x); }
#else
KILN_VM_INLINE float kiln_sinf(float x) { return kiln_vm_sinf(x); }
KILN_VM_INLINE float kiln_cosf(float x) { return kiln_vm_cosf(x); }
#endif

/* ---- tanh ---------------------------------------------------------------- */

/* tanh(a) for 0 <= a < 0.625: a + a^3 P(a^2) (Cephes tanhf). */
KILN_VM_INLINE float kiln_vm_tanh_small(float a) {
    float z = a * a;
    float p = -5.70498872745e-3f;
    p = KILN_VM_FMAF(p, z, 2.06390887954e-2f);
    p = KILN_VM_FMAF(p, z, -5.37397155531e-2f);
    p = KILN_VM_FMAF(p, z, 1.33314422036e-1f);
    p = KILN_VM_FMAF(p, z, -3.33332819422e-1f);
    return KILN_VM_FMAF(p * z, a, a);
}

KILN_VM_INLINE float kiln_tanhf(float x) {
    float a = kiln_vm_abs(x);
    float big = 1.0f - 2.0f / (kiln_expf(a + a) + 1.0f); /* inf -> 1 */
    float y = kiln_vm_sel(a < 0.625f, kiln_vm_tanh_small(a), big);
    return kiln_vm_copysign(y, x);
}

/* ---- erf ----------------------------------------------------------------- */

/* erf(a) = a + a R(a^2) on 0 <= a <= 1, R(t) ~ erf(a)/a - 1 with absolute
 * error 1.2e-9 (2^-29.7); a + a R rounds once, which keeps it near 0.5 ulp. */
KILN_VM_INLINE float kiln_vm_erf_small(float a) {
    float t = a * a;
    float p = 7.889122935e-05f;
    p = KILN_VM_FMAF(p, t, -8.020842215e-04f);
    p = KILN_VM_FMAF(p, t, 5.189535674e-03f);
    p = KILN_VM_FMAF(p, t, -2.685444430e-02f);
    p = KILN_VM_FMAF(p, t, 1.128360033e-01f);
    p = KILN_VM_FMAF(p, t, -3.761262596e-01f);
    p = KILN_VM_FMAF(p, t, 1.283791661e-01f);
    return KILN_VM_FMAF(a, p, a);
}

/* log(erfc(1 + u)) on 0 <= u <= 3, fitted weighted by erfc: the error it
 * leaves in erf = 1 - erfc is below 1.1e-9 (2^-29.9). */
KILN_VM_INLINE float kiln_vm_log_erfc(float u) {
    float p = 1.855740265e-04f;
    p = KILN_VM_FMAF(p, u, -1.826163265e-03f);
    p = KILN_VM_FMAF(p, u, 9.890891612e-03f);
    p = KILN_VM_FMAF(p, u, -4.150068760e-02f);
    p = KILN_VM_FMAF(p, u, -8.431183100e-01f);
    p = KILN_VM_FMAF(p, u, -2.638966799e+00f);
    return KILN_VM_FMAF(p, u, -1.849605560e+00f);
}

/* e^y for y in [-18, -1.8] (log_erfc's range): no clamps, no
 * denormals, and no compensation, as 1 - e^y hides e^y's error
 * (e^y <= 0.16). */
KILN_VM_INLINE float kiln_vm_exp_erfc(float y) {
    int32_t n;
    float p = kiln_vm_exp_lean(y, &n);
    return kiln_vm_float(kiln_vm_bits(p) + ((uint32_t)n << 23));
}

KILN_VM_INLINE float kiln_erff(float x) {
    float a = kiln_vm_abs(x);
    float ac = kiln_vm_sel(a > 4.0f, 4.0f, a);  /* erf(x) is 1.0f past 3.92 */
    float big = 1.0f - kiln_vm_exp_erfc(kiln_vm_log_erfc(ac - 1.0f));
    float y = kiln_vm_sel(!(a >= 1.0f), kiln_vm_erf_small(a), big);  /* NaN: small */
    return kiln_vm_copysign(y, x);
}

/* ---- gelu ---------------------------------------------------------------- */

/* log2(2 Phi(-a)) on 0 <= a <= 5.5 (Phi the normal CDF) as a P(a), P of
 * degree 7, fitted by scripts/fit_gelu.py (weighted minimax, float
 * coefficients): the error it leaves in gelu is below 0.15 of the
 * tolerance test_vecmath asserts (an ulp for x >= 0, 2^-23 for x < 0).
 * The factor a makes the value exact at a = 0 and its rounding error
 * relative, so it is smallest where h is largest. */
KILN_VM_INLINE float kiln_vm_log2_2phi(float a) {
#if KILN_VM_ESTRIN
    /* (c7 + a S(a)) a, S by Estrin */
    float a2 = a * a, a4 = a2 * a2;
    float f0 = -4.5920479298e-01f + -5.2512232214e-02f * a;
    float f1 = 7.0950514637e-03f + -1.6734712699e-04f * a;
    float f2 = -1.7120584380e-04f + 3.5767443478e-05f * a;
    float sa = (f0 + f1 * a2) + (f2 + -2.4987989491e-06f * a2) * a4;
    float p = -1.1511054039e+00f + sa * a;
#else
    float p = -2.4987989491e-06f;
    p = KILN_VM_FMAF(p, a, 3.5767443478e-05f);
    p = KILN_VM_FMAF(p, a, -1.7120584380e-04f);
    p = KILN_VM_FMAF(p, a, -1.6734712699e-04f);
    p = KILN_VM_FMAF(p, a, 7.0950514637e-03f);
    p = KILN_VM_FMAF(p, a, -5.2512232214e-02f);
    p = KILN_VM_FMAF(p, a, -4.5920479298e-01f);
    p = KILN_VM_FMAF(p, a, -1.1511054039e+00f);
#endif
    return p * a;
}

/* 2^r / 2 on -0.5 <= r <= 0.5, degree 6 (scripts/fit_gelu.py): relative
 * error below 2^-28. */
KILN_VM_INLINE float kiln_vm_half_exp2(float r) {
#if KILN_VM_ESTRIN
    /* 0.5 + r S(r), S by Estrin: the last step keeps Horner's accuracy */
    float r2 = r * r, r4 = r2 * r2;
    float e0 = 3.4657359123e-01f + 1.2011323869e-01f * r;
    float e1 = 2.7751797810e-02f + 4.8092496581e-03f * r;
    float e2 = 6.6954852082e-04f + 7.6646552770e-05f * r;
    float sr = (e0 + e1 * r2) + e2 * r4;
    return 0.5f + sr * r;
#else
    float p = 7.6646552770e-05f;
    p = KILN_VM_FMAF(p, r, 6.6954852082e-04f);
    p = KILN_VM_FMAF(p, r, 4.8092496581e-03f);
    p = KILN_VM_FMAF(p, r, 2.7751797810e-02f);
    p = KILN_VM_FMAF(p, r, 1.2011323869e-01f);
    p = KILN_VM_FMAF(p, r, 3.4657359123e-01f);
    return KILN_VM_FMAF(p, r, 0.5f);
#endif
}

/* gelu(x) = x Phi(x) (torch's exact, erf form) directly. With a = |x|
 * and h = Phi(-a) = 2^(q - 1), q = log2_2phi(a): x (1 - h) for x >= 0
 * (one FMA) and x h for x < 0, which keeps the small negative results
 * accurate where 1 + erf(x/sqrt2) cancels. 2^(q - 1) is half_exp2(r)
 * 2^n with n = q rounded to the nearest integer and r = q - n, exact;
 * h >= 2^-26 is a normal float, so adding n to its exponent is exact.
 * From a = 5.5 on, h is 0: x for x >= 0 (x h < 2^-25 x rounds away there,
 * and +inf stays), -0 for x < 0 (|gelu| < 1.1e-7 there; torch's float
 * formula gives -0 too), and NaN for -inf (-inf times 0, as torch and the
 * interpreter give). */
KILN_VM_INLINE float kiln_vm_gelu(float x) {
    float a = kiln_vm_abs(x);
    float ac = kiln_vm_sel(a > 5.5f, 5.5f, a);  /* NaN stays NaN */
    float q = kiln_vm_log2_2phi(ac);
    const float magic = 12582912.0f;
    float t = q + magic;
    float r = q - (t - magic);
    float p = kiln_vm_half_exp2(r);
    float h = kiln_vm_float(kiln_vm_bits(p) + ((kiln_vm_bits(t) - kiln_vm_bits(magic)) << 23));
    h = kiln_vm_sel(ac == 5.5f, 0.0f, h);
    return kiln_vm_sel(x >= 0.0f, KILN_VM_FMAF(-ac, h, x), x * h);
}

/* gelu in AVX-512, as exp above: the same operations on 16 lanes (so the
 * same bits, NaN payloads aside), in fewer vector operations than the C
 * form compiles to (docs/decisions.md: gelu in log2 form): vrangeps
 * takes min(|x|, 5.5) in one, vreduceps gives r = q - round(q) exactly
 * (so n = q - r), vscalefps multiplies by 2^n and zeroes the lanes from
 * 5.5 on under a mask, and the last two steps are masked (x - ac h where
 * x >= 0, then x h elsewhere). vrangeps and vreduceps are AVX512DQ
 * (AVX512F without it: the C function). On 4 and 8 lanes (KILN_VM_GELU_N)
 * the C form's steps: minps(5.5, |x|) is the clamp (NaN stays NaN),
 * roundps rounds q as the 1.5*2^23 trick does
 * (|q| < 2^22), and n is added to p's exponent bits. The end is one
 * multiply-add (KILN_VM_FMA4/8), a - m h, with its operands chosen
 * beforehand, off the dependency chain: a = x where x's sign bit is
 * clear, else x 0 (-0, NaN for -inf), and m = ac, 0 from 5.5 on. That is
 * the C form's bits: x >= 0 gives x - ac h (x from 5.5 on, where h = 0);
 * x < 0 gives -ac h - 0 = x h (ac = -x below 5.5; -0 from there, or NaN),
 * and x = -0 gives -0 either way. Codegen leaves all of it out of
 * programs without gelu (KILN_VM_NO_GELU_DISPATCH). */
#if KILN_VM_SIMD && (!defined(__AVX512F__) || defined(__AVX512DQ__)) && \
    !defined(KILN_VM_NO_GELU_DISPATCH)
#define KILN_VM_GELU_DISPATCH 1
__attribute__((simd("notinbranch"), const, nothrow, visibility("hidden"))) float kiln_vm_gelu_simd(float x);
__attribute__((used, noinline)) static float kiln_vm_gelu_1(float x) __asm__("kiln_vm_gelu_simd");
static float kiln_vm_gelu_1(float x) { return kiln_vm_gelu(x); }

/* kiln_vm_log2_2phi and kiln_vm_half_exp2 on N lanes, with k the
 * variant's constants, evaluated as the C functions evaluate them. */
#if KILN_VM_ESTRIN
#define KILN_VM_GELU_Q(N, a)                                                                   \
    ({                                                                                         \
        kiln_vm_f##N a2_ = (a) * (a), a4_ = a2_ * a2_;                                         \
        kiln_vm_f##N f0_ = k->q[6] + k->q[5] * (a), f1_ = k->q[4] + k->q[3] * (a);             \
        kiln_vm_f##N f2_ = k->q[2] + k->q[1] * (a);                                            \
        kiln_vm_f##N s_ = (f0_ + f1_ * a2_) + (f2_ + k->q[0] * a2_) * a4_;                     \
        (k->q[7] + s_ * (a)) * (a);                                                            \
    })
#else
#define KILN_VM_GELU_Q(N, a)                                                                   \
    ({                                                                                         \
        kiln_vm_f##N q_ = KILN_VM_FMA##N(k->q[0], (a), k->q[1]);                               \
        q_ = KILN_VM_FMA##N(q_, (a), k->q[2]);                                                 \
        q_ = KILN_VM_FMA##N(q_, (a), k->q[3]);                                                 \
        q_ = KILN_VM_FMA##N(q_, (a), k->q[4]);                                                 \
        q_ = KILN_VM_FMA##N(q_, (a), k->q[5]);                                                 \
        q_ = KILN_VM_FMA##N(q_, (a), k->q[6]);                                                 \
        q_ = KILN_VM_FMA##N(q_, (a), k->q[7]);                                                 \
        q_ * (a);                                                                              \
    })
#endif
#if KILN_VM_ESTRIN
#define KILN_VM_GELU_P(N, r)                                                                   \
    ({                                                                                         \
        kiln_vm_f##N r2_ = (r) * (r), r4_ = r2_ * r2_;                                         \
        kiln_vm_f##N e0_ = k->p[5] + k->p[4] * (r), e1_ = k->p[3] + k->p[2] * (r);             \
        kiln_vm_f##N e2_ = k->p[1] + k->p[0] * (r);                                            \
        k->p[6] + ((e0_ + e1_ * r2_) + e2_ * r4_) * (r);                                       \
    })
#else
#define KILN_VM_GELU_P(N, r)                                                                   \
    ({                                                                                         \
        kiln_vm_f##N p_ = KILN_VM_FMA##N(k->p[0], (r), k->p[1]);                               \
        p_ = KILN_VM_FMA##N(p_, (r), k->p[2]);                                                 \
        p_ = KILN_VM_FMA##N(p_, (r), k->p[3]);                                                 \
        p_ = KILN_VM_FMA##N(p_, (r), k->p[4]);                                                 \
        p_ = KILN_VM_FMA##N(p_, (r), k->p[5]);                                                 \
        KILN_VM_FMA##N(p_, (r), k->p[6]);                                                      \
    })
#endif
#define KILN_VM_GELU_N(N)                                                                  \
    KILN_VM_INLINE kiln_vm_f##N kiln_vm_gelu##N(kiln_vm_f##N x) {                          \
        KILN_VM_CONSTS(k, kiln_vm_u##N abs; kiln_vm_f##N lim; kiln_vm_f##N q[8];           \
                       kiln_vm_f##N p[7],                                                  \
                       KILN_VM_USPLAT##N(0x7fffffffu), KILN_VM_SPLAT##N(5.5f),             \
                       {KILN_VM_SPLAT##N(-2.4987989491e-06f), KILN_VM_SPLAT##N(3.5767443478e-05f), \
                        KILN_VM_SPLAT##N(-1.7120584380e-04f), KILN_VM_SPLAT##N(-1.6734712699e-04f), \
                        KILN_VM_SPLAT##N(7.0950514637e-03f), KILN_VM_SPLAT##N(-5.2512232214e-02f), \
                        KILN_VM_SPLAT##N(-4.5920479298e-01f), KILN_VM_SPLAT##N(-1.1511054039e+00f)}, \
                       {KILN_VM_SPLAT##N(7.6646552770e-05f), KILN_VM_SPLAT##N(6.6954852082e-04f), \
                        KILN_VM_SPLAT##N(4.8092496581e-03f), KILN_VM_SPLAT##N(2.7751797810e-02f), \
                        KILN_VM_SPLAT##N(1.2011323869e-01f), KILN_VM_SPLAT##N(3.4657359123e-01f), \
                        KILN_VM_SPLAT##N(0.5f)});                                          \
        kiln_vm_f##N ac = KILN_VM_MIN##N(k->lim, (kiln_vm_f##N)((kiln_vm_u##N)x & k->abs)); \
        kiln_vm_f##N q = KILN_VM_GELU_Q(N, ac);                 /* kiln_vm_log2_2phi */    \
        kiln_vm_f##N nf = KILN_VM_ROUND##N(q), r = q - nf;                                 \
        kiln_vm_f##N p = KILN_VM_GELU_P(N, r);                  /* kiln_vm_half_exp2 */    \
        kiln_vm_f##N h = (kiln_vm_f##N)((kiln_vm_u##N)p + ((kiln_vm_u##N)KILN_VM_CVT##N(nf) << 23)); \
        kiln_vm_f##N m = (kiln_vm_f##N)((kiln_vm_u##N)ac & (kiln_vm_u##N)~(ac == k->lim));  \
        kiln_vm_f##N a = KILN_VM_BLEND##N(x, x * 0.0f, x);                                 \
        return KILN_VM_FMA##N(-m, h, a);                                                   \
    }
KILN_VM_GELU_N(4)
KILN_VM_VARIANT(gelu, b, 4, "_ZGVbN4v_kiln_vm_gelu_simd")
#if KILN_VM_SIMD8
KILN_VM_GELU_N(8)
KILN_VM_VARIANT(gelu, d, 8, "_ZGVdN8v_kiln_vm_gelu_simd")
#endif
KILN_VM_CD_VARIANTS(gelu)
#if KILN_VM_AVX512
__attribute__((used, noinline)) static kiln_vm_f16 kiln_vm_gelu_e(kiln_vm_f16 x) __asm__("_ZGVeN16v_kiln_vm_gelu_simd");
static kiln_vm_f16 kiln_vm_gelu_e(kiln_vm_f16 x) {
    const kiln_vm_f16 zero = KILN_VM_SPLAT16(0.0f);
    /* min by magnitude, sign cleared (imm 0xa); NaN stays NaN */
    kiln_vm_f16 ac = __builtin_ia32_rangeps512_mask(x, KILN_VM_SPLAT16(5.5f), 0xa, zero, (uint16_t)-1, 4);
    uint16_t tail = KILN_VM_CMP16(ac, KILN_VM_SPLAT16(5.5f), 0x00);        /* == */
    kiln_vm_f16 q = KILN_VM_FMA16(KILN_VM_SPLAT16(-2.4987989491e-06f), ac, KILN_VM_SPLAT16(3.5767443478e-05f));
    q = KILN_VM_FMA16(q, ac, KILN_VM_SPLAT16(-1.7120584380e-04f));  /* kiln_vm_log2_2phi */
    q = KILN_VM_FMA16(q, ac, KILN_VM_SPLAT16(-1.6734712699e-04f));
    q = KILN_VM_FMA16(q, ac, KILN_VM_SPLAT16(7.0950514637e-03f));
    q = KILN_VM_FMA16(q, ac, KILN_VM_SPLAT16(-5.2512232214e-02f));
    q = KILN_VM_FMA16(q, ac, KILN_VM_SPLAT16(-4.5920479298e-01f));
    q = KILN_VM_FMA16(q, ac, KILN_VM_SPLAT16(-1.1511054039e+00f));
    q = q * ac;
    /* q - round(q), nearest (imm 8: no fraction bits kept, no exceptions) */
    kiln_vm_f16 r = __builtin_ia32_reduceps512_mask(q, 8, zero, (uint16_t)-1);
    kiln_vm_f16 n = q - r;
    kiln_vm_f16 p = KILN_VM_FMA16(KILN_VM_SPLAT16(7.6646552770e-05f), r, KILN_VM_SPLAT16(6.6954852082e-04f));
    p = KILN_VM_FMA16(p, r, KILN_VM_SPLAT16(4.8092496581e-03f));    /* kiln_vm_half_exp2 */
    p = KILN_VM_FMA16(p, r, KILN_VM_SPLAT16(2.7751797810e-02f));
    p = KILN_VM_FMA16(p, r, KILN_VM_SPLAT16(1.2011323869e-01f));
    p = KILN_VM_FMA16(p, r, KILN_VM_SPLAT16(3.4657359123e-01f));
    p = KILN_VM_FMA16(p, r, KILN_VM_SPLAT16(0.5f));
    kiln_vm_f16 h = __builtin_ia32_scalefps512_mask(p, n, zero, (uint16_t)~tail, 4);
    uint16_t pos = KILN_VM_CMP16(x, zero, 0x1d);                        /* >= */
    kiln_vm_f16 y = __builtin_ia32_vfnmaddps512_mask3(ac, h, x, pos, 4);  /* x - ac h */
    return __builtin_ia32_mulps512_mask(y, h, y, (uint16_t)~pos, 4);      /* x h */
}
#endif
KILN_VM_INLINE float kiln_gelu(float x) { return kiln_vm_gelu_simd(x); }
#else
#define KILN_VM_GELU_DISPATCH 0
KILN_VM_INLINE float kiln_gelu(float x) { return kiln_vm_gelu(x); }
#endif

/* ---- sigmoid ------------------------------------------------------------- */

/* e = exp(-|x|) in two parts (e + el); s = num / (1 + e) with num = 1
 * (x >= 0) or e. The division is corrected for what rounding dropped: el,
 * and derr, the error of d = 1 + e (exact by Fast2Sum); 1 / d is q itself
 * (x >= 0) or 1 - q. Without this, a binade step between e and s doubles
 * exp's error and sigmoid reaches 2 ulp. */
KILN_VM_INLINE float kiln_sigmoidf(float x) {
    float a = -kiln_vm_abs(x);
    float el;
    int32_t n;
    float hi = kiln_vm_exp_core(kiln_vm_sel(a < -104.0f, -104.0f, a), &el, &n);
    int under = a < KILN_VM_EXP_LO;
    float e = kiln_vm_sel(under, 0.0f, kiln_vm_scale(hi, n));
    el = kiln_vm_sel(under, 0.0f, kiln_vm_scale(el, n));
    float d = 1.0f + e;
    float derr = ((1.0f - d) + e) + el;
    int pos = x >= 0.0f;
    float q = kiln_vm_sel(pos, 1.0f, e) / d;
    float inv = kiln_vm_sel(pos, q, 1.0f - q);
    return KILN_VM_FMAF(kiln_vm_sel(pos, 0.0f, el) - q * derr, inv, q);
}

/* sigmoid in vector operations, as exp and gelu above: the C function's
 * steps on N lanes, so its bits (NaN payloads aside). The C form compiles
 * to integer arithmetic for the two 2^n scalings and bit-mask blends for
 * its five selects; with AVX-512 the clamp is one vmaxps, n one
 * vrndscaleps, each scaling vscalefps (one rounding, as kiln_vm_scale's
 * exact first step and rounding second one: e's first step is exact since
 * hi is in [0.7, 1.42]; el's two steps are kept, n halved toward 0 as
 * kiln_vm_scale does, since el may be small enough for the first to
 * round) and the selects are masked moves: about 43 vector instructions
 * against the C form's 68 (docs/decisions.md: vecmath: sigmoid's vector
 * variants). On 4 and 8 lanes (KILN_VM_SIGMOID_N) the C form's steps in
 * vector extensions: maxps(-104, a) is the clamp (a NaN a stays NaN),
 * roundps rounds n, the scalings are the two exponent-built factors, and
 * the selects are blendvps. Codegen leaves all of it out of programs
 * without sigmoid (KILN_VM_NO_SIGMOID_DISPATCH). */
#if KILN_VM_SIMD && !defined(KILN_VM_NO_SIGMOID_DISPATCH)
#define KILN_VM_SIGMOID_DISPATCH 1
__attribute__((simd("notinbranch"), const, nothrow, visibility("hidden"))) float kiln_vm_sigmoidf_simd(float x);
__attribute__((used, noinline)) static float kiln_vm_sigmoidf_1(float x) __asm__("kiln_vm_sigmoidf_simd");
static float kiln_vm_sigmoidf_1(float x) { return kiln_sigmoidf(x); }

#define KILN_VM_SIGMOID_N(N)                                                               \
    KILN_VM_INLINE kiln_vm_f##N kiln_vm_sigmoidf##N(kiln_vm_f##N x) {                      \
        KILN_VM_CONSTS(k, kiln_vm_u##N sign; kiln_vm_f##N clamp; kiln_vm_f##N log2e;       \
                       kiln_vm_f##N c1; kiln_vm_f##N c2; kiln_vm_f##N p[6]; kiln_vm_f##N one; \
                       kiln_vm_f##N lo; kiln_vm_f##N zero,                                 \
                       KILN_VM_USPLAT##N(0x80000000u), KILN_VM_SPLAT##N(-104.0f),          \
                       KILN_VM_SPLAT##N(1.44269504088896341f),                             \
                       KILN_VM_SPLAT##N(0.693359375f), KILN_VM_SPLAT##N(2.12194440e-4f),   \
                       {KILN_VM_SPLAT##N(1.9875691500e-4f), KILN_VM_SPLAT##N(1.3981999507e-3f), \
                        KILN_VM_SPLAT##N(8.3334519073e-3f), KILN_VM_SPLAT##N(4.1665795894e-2f), \
                        KILN_VM_SPLAT##N(1.6666665459e-1f), KILN_VM_SPLAT##N(5.0000001201e-1f)}, \
                       KILN_VM_SPLAT##N(1.0f), KILN_VM_SPLAT##N(KILN_VM_EXP_LO),           \
                       KILN_VM_SPLAT##N(0.0f));                                            \
        kiln_vm_f##N a = (kiln_vm_f##N)((kiln_vm_u##N)x | k->sign);                        \
        kiln_vm_f##N xc = KILN_VM_MAX##N(k->clamp, a);                                     \
        kiln_vm_f##N nf = KILN_VM_ROUND##N(xc * k->log2e);      /* kiln_vm_exp_core */     \
        kiln_vm_f##N rhi = xc - nf * k->c1, rlo = nf * k->c2, r = rhi + rlo;               \
        kiln_vm_f##N h = k->one + rhi;                                                     \
        kiln_vm_f##N p = KILN_VM_FMA##N(k->p[0], r, k->p[1]);   /* kiln_vm_exp_poly */     \
        p = KILN_VM_FMA##N(p, r, k->p[2]);                                                 \
        p = KILN_VM_FMA##N(p, r, k->p[3]);                                                 \
        p = KILN_VM_FMA##N(p, r, k->p[4]);                                                 \
        p = KILN_VM_FMA##N(p, r, k->p[5]);                                                 \
        kiln_vm_f##N tail = ((k->one - h) + rhi) + KILN_VM_FMA##N(r * r, p, rlo);          \
        kiln_vm_f##N hi = h + tail, lo = (h - hi) + tail;                                  \
        kiln_vm_i##N n = KILN_VM_CVT##N(nf), n1 = n / 2, n2 = n - n1;  /* kiln_vm_scale */ \
        kiln_vm_f##N s1 = (kiln_vm_f##N)((kiln_vm_u##N)(n1 + 127) << 23);                  \
        kiln_vm_f##N s2 = (kiln_vm_f##N)((kiln_vm_u##N)(n2 + 127) << 23);                  \
        kiln_vm_i##N under = a < k->lo, pos = x >= k->zero;                                \
        kiln_vm_f##N e = KILN_VM_BLEND##N(hi * s1 * s2, k->zero, under);                   \
        kiln_vm_f##N el = KILN_VM_BLEND##N(lo * s1 * s2, k->zero, under);                  \
        kiln_vm_f##N d = k->one + e, derr = ((k->one - d) + e) + el;                       \
        kiln_vm_f##N q = KILN_VM_BLEND##N(e, k->one, pos) / d;                             \
        kiln_vm_f##N inv = KILN_VM_BLEND##N(k->one - q, q, pos);                           \
        return KILN_VM_FMA##N(KILN_VM_BLEND##N(el, k->zero, pos) - q * derr, inv, q);      \
    }
KILN_VM_SIGMOID_N(4)
KILN_VM_VARIANT(sigmoidf, b, 4, "_ZGVbN4v_kiln_vm_sigmoidf_simd")
#if KILN_VM_SIMD8
KILN_VM_SIGMOID_N(8)
KILN_VM_VARIANT(sigmoidf, d, 8, "_ZGVdN8v_kiln_vm_sigmoidf_simd")
#endif
KILN_VM_CD_VARIANTS(sigmoidf)
#if KILN_VM_AVX512
__attribute__((used, noinline)) static kiln_vm_f16 kiln_vm_sigmoidf_e(kiln_vm_f16 x) __asm__("_ZGVeN16v_kiln_vm_sigmoidf_simd");
static kiln_vm_f16 kiln_vm_sigmoidf_e(kiln_vm_f16 x) {
    const kiln_vm_f16 zero = KILN_VM_SPLAT16(0.0f), one = KILN_VM_SPLAT16(1.0f);
    kiln_vm_f16 a = (kiln_vm_f16)((kiln_vm_u16)x | (kiln_vm_u16)KILN_VM_SPLAT16(-0.0f));
    /* -104 > a ? -104 : a, so a NaN a stays NaN */
    kiln_vm_f16 xc = __builtin_ia32_maxps512_mask(KILN_VM_SPLAT16(-104.0f), a, zero, (uint16_t)-1, 4);
    kiln_vm_f16 nf = __builtin_ia32_rndscaleps_mask(xc * 1.44269504088896341f, 8, xc, (uint16_t)-1, 4);
    kiln_vm_f16 rhi = KILN_VM_FMA16(nf, KILN_VM_SPLAT16(-0.693359375f), xc); /* exact */
    kiln_vm_f16 rlo = nf * 2.12194440e-4f, r = rhi + rlo;
    kiln_vm_f16 h = one + rhi;
    kiln_vm_f16 p = KILN_VM_FMA16(KILN_VM_SPLAT16(1.9875691500e-4f), r, KILN_VM_SPLAT16(1.3981999507e-3f));
    p = KILN_VM_FMA16(p, r, KILN_VM_SPLAT16(8.3334519073e-3f));   /* kiln_vm_exp_poly */
    p = KILN_VM_FMA16(p, r, KILN_VM_SPLAT16(4.1665795894e-2f));
    p = KILN_VM_FMA16(p, r, KILN_VM_SPLAT16(1.6666665459e-1f));
    p = KILN_VM_FMA16(p, r, KILN_VM_SPLAT16(5.0000001201e-1f));
    kiln_vm_f16 tail = ((one - h) + rhi) + KILN_VM_FMA16(r * r, p, rlo);
    kiln_vm_f16 hi = h + tail, lo = (h - hi) + tail;
    /* not under: !(a < EXP_LO), true for NaN (imm 0x15: not less, unordered) */
    uint16_t keep = KILN_VM_CMP16(a, KILN_VM_SPLAT16(KILN_VM_EXP_LO), 0x15);
    /* n1 = n / 2 toward 0 (imm 0xb: truncate, no exceptions), n2 = n - n1 */
    kiln_vm_f16 n1 = __builtin_ia32_rndscaleps_mask(nf * 0.5f, 0xb, nf, (uint16_t)-1, 4);
    kiln_vm_f16 e = __builtin_ia32_scalefps512_mask(hi, nf, zero, keep, 4);
    kiln_vm_f16 el = __builtin_ia32_scalefps512_mask(lo, n1, zero, keep, 4);
    el = __builtin_ia32_scalefps512_mask(el, nf - n1, zero, keep, 4);
    kiln_vm_f16 d = one + e, derr = ((one - d) + e) + el;
    uint16_t pos = KILN_VM_CMP16(x, zero, 0x1d); /* >= */
    kiln_vm_f16 q = KILN_VM_SEL16(pos, one, e) / d;
    kiln_vm_f16 inv = KILN_VM_SEL16(pos, q, one - q);
    kiln_vm_f16 t = KILN_VM_SEL16(pos, zero, el) - q * derr;
    return KILN_VM_FMA16(t, inv, q);
}
#endif
KILN_VM_INLINE float kiln_sigmoid(float x) { return kiln_vm_sigmoidf_simd(x); }
#else
#define KILN_VM_SIGMOID_DISPATCH 0
KILN_VM_INLINE float kiln_sigmoid(float x) { return kiln_sigmoidf(x); }
#endif

#endif
