/*
 * base.h -- the bottom layer: everything every stage above may use.
 *
 *   util.c    the allocation hook, arenas, error formatting, tensors,
 *             Philox random numbers
 *   pool.c    Pool (an Arena that longjmps when it runs out) and Str
 *   config.c  KilnConfig: every threshold of lowering and fusion, its
 *             defaults, and the KILN_LOGS switch
 *   target.c  the instruction-set tiers kernels are compiled for
 *
 * Names: functions exported across files carry their module's prefix
 * (util_, pool_, str_, tgt_, kiln_config_); static helpers have none.
 */
#ifndef KILN_BASE_H
#define KILN_BASE_H

#include "kiln.h"
#include "base/kiln_rt.h"
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

_Static_assert(KILN_RT_MAX_RANK == KILN_MAX_RANK,
               "kiln_rt.h's views hold every rank kiln.h allows");

/* Tensor data, weights and the runtime's arena start on a cache line. */
#define KILN_ALIGN 64
/* p rounded up to the next KILN_ALIGN boundary (p itself when on one); a
 * block of n + KILN_ALIGN - 1 bytes holds n from there. */
static inline void *util_on_line(void *p) {
    return (char *)p + (KILN_ALIGN - (uintptr_t)p % KILN_ALIGN) % KILN_ALIGN;
}
void *kmalloc(size_t n); /* NULL when the hook refuses */
void *kcalloc(size_t n, size_t size);
/* MADV_HUGEPAGE on the whole pages of [mem, mem + bytes) when it spans at
 * least 4 MiB (Linux); advice only. */
void util_advise_huge(void *mem, size_t bytes);
void *krealloc(void *p, size_t n);
void kfree(void *p);
char *kstrdup(const char *s);
/* Bytes the default allocator will hold at most: physical memory plus
 * swap, the cgroup limit, or $KILN_MEM_LIMIT (see util.c). */
int64_t util_mem_budget(void);

/* An arena: many small allocations freed at once. */
typedef struct ArenaChunk ArenaChunk;
typedef struct {
    ArenaChunk *head;
} Arena;
void *arena_alloc(Arena *a, size_t n);       /* zeroed; NULL when out of memory */
void *arena_alloc_lines(Arena *a, size_t n); /* the same, KILN_ALIGN-aligned */
char *arena_strdup(Arena *a, const char *s);
void arena_free(Arena *a);

/* snprintf into a fixed buffer that never overflows. */
/* vsnprintf after what buf already holds (a NUL-terminated string), never
 * overflowing it. */
void util_vappend(char *buf, size_t len, const char *fmt, va_list ap);
void util_fmt(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Write path through fn under a temporary name beside it, renamed into
 * place, so a failure leaves nothing behind; false with errno set. */
bool util_write_file(const char *path, void (*fn)(FILE *, void *), void *ud);
/* The monotonic clock (CLOCK_MONOTONIC): nanoseconds, and milliseconds. */
int64_t util_now_ns(void);
double util_now_ms(void);

/* Philox-4x32-10: four 32-bit random words for (seed, counter). */
/* Element i of the uniform [0,1) / standard normal stream of a seed. */
float util_rand_uniform(uint64_t seed, uint64_t i);
float util_rand_normal(uint64_t seed, uint64_t i);

/* Saturating product of dims; -1 when it overflows int64. */
int64_t util_numel(int rank, const int64_t *shape);
/* Bytes per element of a value of dtype dt in a program's memory (graph
 * weights, the runtime's buffers, kernels' pointers): f64 is a double,
 * f32 and bool are floats (a bool as 0.0f or 1.0f). */
int64_t loop_storage_size(kiln_dtype dt);
/* IEEE half precision and bfloat16 to and from f32 (round to nearest even;
 * an f32 past the half range becomes infinity, NaN stays NaN). */
float util_f16_to_f32(uint16_t h);
uint16_t util_f32_to_f16(float f);
float util_bf16_to_f32(uint16_t h);
uint16_t util_f32_to_bf16(float f);

/* ===== target.c: instruction-set tiers ================================= */
/*
 * target.h -- the instruction-set tier the JIT compiles kernels for.
 *
 * kiln does not compile for bare -march=native: what GCC's native tuning
 * does with a CPU varies too much. GCC 12 on Rocket Lake or Skylake-SP
 * prefers 256-bit vectors and then fails to vectorize any loop that calls
 * an AVX-512 SIMD clone, leaving kernels scalar; on AMD Zen 1 (znver1) it
 * prefers 128-bit ones and does the same to the AVX2 clones
 * (docs/decisions.md: Target tiers instead of -march=native). Kernels are compiled for one of the
 * x86-64 psABI levels instead, chosen at run time from the CPU's features
 * (cpuid) and the state the OS saves (XCR0):
 *
 *   v2      x86-64-v2: SSE4.2, POPCNT, CX16          4 float lanes
 *   v3      x86-64-v3: v2 + AVX2, FMA, BMI1/2, F16C   8 lanes (256-bit
 *           vectors whatever the tuning prefers: -mprefer-vector-width=256)
 *   v4      x86-64-v4: v3 + AVX-512 F/BW/CD/DQ/VL     16 lanes (512-bit
 *           vectors whatever the tuning prefers: -mprefer-vector-width=512)
 *   native  -march=native as GCC resolves it (with 512-bit vectors where
 *           the CPU has AVX-512, 256-bit ones where it has AVX2), for
 *           comparison
 *
 * Each adds -mtune=native: scheduling for this CPU, never an instruction
 * the tier lacks. The default is the highest of v4, v3, v2 this CPU runs
 * (native on a CPU below v2, or not x86-64). $KILN_TARGET or a program's
 * kiln_options.target names one; a tier the CPU cannot run is refused
 * before anything compiles, naming the missing features.
 *
 * The tier also bounds the library kernels (Target.ext): kiln's own
 * AVX-512 code (the 1x1 GEMM, the depthwise rows) runs only under v4 or
 * native, its AVX2 code (the same kernels' AVX2 versions) only under v3 and
 * above, and OpenBLAS's core and oneDNN's ISA are capped to the tier of
 * the first program that calls them in the process (see externs/matmul.c).
 */

/* What library kernels may use (Target.ext, ext_cpu_features). */
enum { EXT_CPU_AVX2 = 1, EXT_CPU_AVX512 = 2 };

typedef enum { TGT_V2, TGT_V3, TGT_V4, TGT_NATIVE, TGT_COUNT } TargetTier;

/* CPU features as bits (TF_*), each with its name in tgt_feature_name. */
enum {
    TF_SSE3,
    TF_SSSE3,
    TF_SSE41,
    TF_SSE42,
    TF_POPCNT,
    TF_CX16,
    TF_LAHF,
    TF_AVX,
    TF_AVX2,
    TF_BMI1,
    TF_BMI2,
    TF_F16C,
    TF_FMA,
    TF_LZCNT,
    TF_MOVBE,
    TF_OSXSAVE,
    TF_OS_AVX, /* XCR0: the OS saves the SSE and AVX state */
    TF_AVX512F,
    TF_AVX512BW,
    TF_AVX512CD,
    TF_AVX512DQ,
    TF_AVX512VL,
    TF_OS_AVX512, /* XCR0: the OS saves the opmask and ZMM state */
    TF_COUNT
};
#define TF_BIT(f) (1u << (f))

typedef struct {
    TargetTier tier;
    const char *name; /* "v2", "v3", "v4", "native" */
    char flags[160];  /* the compiler flags that select it */
    int lanes;        /* floats in one vector of the kernels */
    unsigned ext;     /* EXT_CPU_* bits the library kernels may use */
} Target;

/* The feature bits of raw cpuid words: leaf 1 ecx/edx, leaf 7 (subleaf
 * 0) ebx, leaf 0x80000001 ecx, and XCR0 (0 when OSXSAVE is off). Pure,
 * so any CPU can be described in a test. */
unsigned tgt_features_from_cpuid(uint32_t l1_ecx, uint32_t l7_ebx, uint32_t e1_ecx, uint64_t xcr0);
/* This CPU's (memoized). 0 on a CPU that is not x86-64. */
unsigned tgt_cpu_features(void);
/* Whether cpuid's vendor string is "GenuineIntel" (memoized). */
bool tgt_cpu_intel(void);
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

/* ===== configuration ================================================== */

/* Topics of KILN_LOGS (a comma list: fusion,schedule,inline,loop_ir,rewrite,
 * team; "all"). */
enum {
    LOG_FUSION = 1 << 0,   /* rounds: candidates, rejections, fusions */
    LOG_SCHEDULE = 1 << 1, /* the scheduler nodes before fusion, final kernels */
    LOG_INLINE = 1 << 2,   /* each pointwise value: inlined or materialized, why */
    LOG_LOOP_IR = 1 << 3,  /* the loop IR after lowering */
    LOG_REWRITE = 1 << 4,  /* graph rewrites applied or declined (Conv-BN folding) */
    LOG_TEAM = 1 << 5,     /* each run's team size: every epoch measured (runtime/team.c) */
};

/* Every threshold of lowering and fusion, with where its default comes from. */
typedef struct {
    /* A pointwise value read by more consumers than this is materialized:
     * recomputing it in each costs more than one write and N reads. 4 follows
     * Inductor's realize_reads_threshold. */
    int max_inline_users;
    /* A pointwise value whose expression (with everything inlined into it)
     * has more ops than this is materialized, bounding kernel bodies and
     * recompute; Inductor's realize_opcount_threshold is 30. */
    int max_inline_ops;
    /* A fused node never holds more member nodes than this ("exceeds max
     * fusion"); Inductor's config.max_fusion_size. */
    int max_fusion_size;
    /* At most this many fusion rounds (Inductor: 10). */
    int max_rounds;
    /* The register budget of the target's vector unit: 32 zmm registers on
     * AVX-512 (16 ymm on AVX2). A fused body estimated to keep more values
     * live at once would spill ("register pressure"). */
    int vector_registers;
    /* Candidate pairs are only formed between a buffer's users at most this
     * many users apart (Inductor's max_fusion_buffer_group_pairwise_attempts). */
    int proximity_window;
    /* A horizontal fusion may raise the planned peak memory by at most this
     * fraction of it (0: not at all). */
    double peak_memory_slack;
    /* Pointwise consumers of an extern's output (bias, BN affine, relu, a
     * residual add, chains of these) fuse into the extern call as its
     * epilogue, run on each output block while it is in cache (on). false:
     * an extern is a wall ("node1 is extern"), as in Inductor. */
    bool extern_epilogue;
    /* Row reductions over long rows run two rows per iteration (row pairs,
     * codegen/pairs.c). kiln_config_default() takes $KILN_ROW_PAIRS (0 or
     * 1) when set, else turns them on for Intel CPUs only: two memory
     * streams per core made rowsum 1.20-1.64x faster on an Intel Xeon and
     * 1.2-1.7x slower on an AMD EPYC (docs/decisions.md: Row pairs). */
    bool row_pairs;
    /* LOG_* bits; kiln_config_default() reads them from KILN_LOGS. */
    unsigned logs;
    /* Where log lines go; NULL means stderr. */
    FILE *log;
    /* The instruction-set tier kernels are compiled for (target.h);
     * kiln_config_default() takes $KILN_TARGET when valid and runnable,
     * else the highest tier this CPU runs. */
    Target target;
} KilnConfig;

KilnConfig kiln_config_default(void);
/* The LOG_* bits named in KILN_LOGS (0 when unset). Unknown names are ignored. */
unsigned loop_logs_from_env(void);
/* printf to cfg->log (or stderr) when topic is on. */
void loop_log(const KilnConfig *cfg, unsigned topic, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ===== Pool: an Arena that longjmps when it runs out ====================== */

typedef struct {
    Arena arena;
    jmp_buf *oom; /* where to go on failure; NULL: abort() */
} Pool;

void *pool_alloc(Pool *p, size_t n); /* zeroed, never NULL */
char *pool_strdup(Pool *p, const char *s);
char *pool_printf(Pool *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Grow an array held in the pool to hold at least `need` items (doubling). */
void *pool_grow(Pool *p, void *arr, int *cap, int need, size_t item);
void pool_free(Pool *p);

/* A growable string in a pool. */
typedef struct {
    Pool *pool;
    char *s;
    size_t n, cap;
} Str;
void str_init(Str *s, Pool *p);
void str_putf(Str *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *str_get(Str *s); /* "" when nothing was written */

#endif
