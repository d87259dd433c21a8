/*
 * target.h -- the instruction-set tier the JIT compiles kernels for.
 *
 * kiln does not compile for bare -march=native: what GCC's native tuning
 * does with a CPU varies too much (GCC 12 on Rocket Lake or Skylake-SP
 * prefers 256-bit vectors and then fails to vectorize any loop that calls
 * an AVX-512 SIMD clone, leaving kernels scalar: 137x slower). Kernels are
 * compiled for one of the x86-64 psABI levels instead, chosen at run time
 * from the CPU's features (cpuid) and the state the OS saves (XCR0):
 *
 *   v2      x86-64-v2: SSE4.2, POPCNT, CX16          4 float lanes
 *   v3      x86-64-v3: v2 + AVX2, FMA, BMI1/2, F16C   8 lanes
 *   v4      x86-64-v4: v3 + AVX-512 F/BW/CD/DQ/VL     16 lanes (512-bit
 *           vectors whatever the tuning prefers: -mprefer-vector-width=512)
 *   native  -march=native as GCC resolves it (with 512-bit vectors where
 *           the CPU has AVX-512), for comparison
 *
 * Each adds -mtune=native: scheduling for this CPU, never an instruction
 * the tier lacks. The default is the highest of v4, v3, v2 this CPU runs
 * (native on a CPU below v2, or not x86-64). $KILN_TARGET or a program's
 * kiln_options.target names one; a tier the CPU cannot run is refused
 * before anything compiles, naming the missing features.
 *
 * The tier also bounds the library kernels (Target.ext): kiln's own
 * AVX-512 code (the 1x1 GEMM, the depthwise rows) runs only under v4 or
 * native, and OpenBLAS's core and oneDNN's ISA are capped to the tier of
 * the first program that calls them in the process (see externs.c).
 */
#ifndef KILN_TARGET_H
#define KILN_TARGET_H

#include "kiln.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What library kernels may use (Target.ext, ext_cpu_features). */
enum { EXT_CPU_AVX2 = 1, EXT_CPU_AVX512 = 2 };

typedef enum { TGT_V2, TGT_V3, TGT_V4, TGT_NATIVE, TGT_COUNT } TargetTier;

/* CPU features as bits (TF_*), each with its name in tgt_feature_name. */
enum {
    TF_SSE3, TF_SSSE3, TF_SSE41, TF_SSE42, TF_POPCNT, TF_CX16, TF_LAHF,
    TF_AVX, TF_AVX2, TF_BMI1, TF_BMI2, TF_F16C, TF_FMA, TF_LZCNT, TF_MOVBE, TF_OSXSAVE,
    TF_OS_AVX,       /* XCR0: the OS saves the SSE and AVX state */
    TF_AVX512F, TF_AVX512BW, TF_AVX512CD, TF_AVX512DQ, TF_AVX512VL,
    TF_OS_AVX512,    /* XCR0: the OS saves the opmask and ZMM state */
    TF_COUNT
};
#define TF_BIT(f) (1u << (f))

typedef struct {
    TargetTier tier;
    const char *name;      /* "v2", "v3", "v4", "native" */
    char flags[160];       /* the compiler flags that select it */
    int lanes;             /* floats in one vector of the kernels */
    unsigned ext;          /* EXT_CPU_* bits the library kernels may use */
} Target;

/* The feature bits of raw cpuid words: leaf 1 ecx/edx, leaf 7 (subleaf
 * 0) ebx, leaf 0x80000001 ecx, and XCR0 (0 when OSXSAVE is off). Pure,
 * so any CPU can be described in a test. */
unsigned tgt_features_from_cpuid(uint32_t l1_ecx, uint32_t l7_ebx, uint32_t e1_ecx, uint64_t xcr0);
/* This CPU's (memoized). 0 on a CPU that is not x86-64. */
unsigned tgt_cpu_features(void);
const char *tgt_feature_name(int f);
/* The features tier needs, as TF bits (native: none). */
unsigned tgt_tier_needs(TargetTier t);
/* The features of `need` that `have` lacks, as "avx512f, avx512bw" in buf
 * ("" when none). Returns buf. */
const char *tgt_missing(unsigned need, unsigned have, char *buf, size_t n);
/* Whether a CPU with these features runs tier t (native: always). */
bool tgt_can_run(TargetTier t, unsigned features);
/* The highest of v4, v3, v2 features allow; TGT_NATIVE when none. */
TargetTier tgt_best(unsigned features);
/* "v2", "v3", "v4", "native" ("?" out of range). */
const char *tgt_name(TargetTier t);
/* The EXT_CPU_* bits features give library kernels: AVX2 with FMA (and
 * the AVX state saved), AVX-512 F/BW/DQ/VL (and its state saved). */
unsigned tgt_ext_of(unsigned features);

/* "v2" ... "native" -> tier; -1 for any other name. */
int tgt_tier_of(const char *name);
/* "v2, v3, v4, native". */
const char *tgt_valid_names(void);

/* The tier named by name (NULL or "": $KILN_TARGET, else the best this CPU
 * runs) with its flags. KILN_ERR_INPUT for an unknown name (the message
 * lists the valid ones), KILN_ERR_ENV for a tier this CPU cannot run (it
 * names the missing features). */
kiln_status tgt_resolve(const char *name, Target *out, char *err, size_t errlen);
/* The same for a tier and a feature set (tests describe other CPUs). */
kiln_status tgt_make(TargetTier t, unsigned features, Target *out, char *err, size_t errlen);

#endif
