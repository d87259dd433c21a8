/*
 * target.c -- the JIT's instruction-set tier (target.h): the CPU's
 * features from cpuid and XCR0, the psABI level each tier needs, and the
 * compiler flags of each.
 */
#include "base/base.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

static const char *const feature_names[TF_COUNT] = {
    [TF_SSE3] = "sse3",
    [TF_SSSE3] = "ssse3",
    [TF_SSE41] = "sse4.1",
    [TF_SSE42] = "sse4.2",
    [TF_POPCNT] = "popcnt",
    [TF_CX16] = "cx16",
    [TF_LAHF] = "lahf_lm",
    [TF_AVX] = "avx",
    [TF_AVX2] = "avx2",
    [TF_BMI1] = "bmi1",
    [TF_BMI2] = "bmi2",
    [TF_F16C] = "f16c",
    [TF_FMA] = "fma",
    [TF_LZCNT] = "lzcnt",
    [TF_MOVBE] = "movbe",
    [TF_OSXSAVE] = "osxsave",
    [TF_OS_AVX] = "AVX state saved by the OS (XCR0)",
    [TF_AVX512F] = "avx512f",
    [TF_AVX512BW] = "avx512bw",
    [TF_AVX512CD] = "avx512cd",
    [TF_AVX512DQ] = "avx512dq",
    [TF_AVX512VL] = "avx512vl",
    [TF_OS_AVX512] = "AVX-512 state saved by the OS (XCR0)",
};

const char *tgt_feature_name(int f) { return f >= 0 && f < TF_COUNT ? feature_names[f] : "?"; }

/* The psABI levels (the x86-64 psABI's "micro-architecture levels"). */
#define NEED_V2                                                                 \
    (TF_BIT(TF_SSE3) | TF_BIT(TF_SSSE3) | TF_BIT(TF_SSE41) | TF_BIT(TF_SSE42) | \
     TF_BIT(TF_POPCNT) | TF_BIT(TF_CX16) | TF_BIT(TF_LAHF))
#define NEED_V3                                                                                    \
    (NEED_V2 | TF_BIT(TF_AVX) | TF_BIT(TF_AVX2) | TF_BIT(TF_BMI1) | TF_BIT(TF_BMI2) |              \
     TF_BIT(TF_F16C) | TF_BIT(TF_FMA) | TF_BIT(TF_LZCNT) | TF_BIT(TF_MOVBE) | TF_BIT(TF_OSXSAVE) | \
     TF_BIT(TF_OS_AVX))
#define NEED_V4                                                                 \
    (NEED_V3 | TF_BIT(TF_AVX512F) | TF_BIT(TF_AVX512BW) | TF_BIT(TF_AVX512CD) | \
     TF_BIT(TF_AVX512DQ) | TF_BIT(TF_AVX512VL) | TF_BIT(TF_OS_AVX512))

unsigned tgt_tier_needs(TargetTier t) {
    switch (t) {
    case TGT_V2: return NEED_V2;
    case TGT_V3: return NEED_V3;
    case TGT_V4: return NEED_V4;
    default: return 0;
    }
}

unsigned tgt_features_from_cpuid(uint32_t l1_ecx, uint32_t l7_ebx, uint32_t e1_ecx, uint64_t xcr0) {
    static const struct {
        uint8_t word, bit, f;
    } map[] = {
        {0, 0, TF_SSE3},      {0, 9, TF_SSSE3},     {0, 12, TF_FMA},      {0, 13, TF_CX16},
        {0, 19, TF_SSE41},    {0, 20, TF_SSE42},    {0, 22, TF_MOVBE},    {0, 23, TF_POPCNT},
        {0, 27, TF_OSXSAVE},  {0, 28, TF_AVX},      {0, 29, TF_F16C},     {1, 3, TF_BMI1},
        {1, 5, TF_AVX2},      {1, 8, TF_BMI2},      {1, 16, TF_AVX512F},  {1, 17, TF_AVX512DQ},
        {1, 28, TF_AVX512CD}, {1, 30, TF_AVX512BW}, {1, 31, TF_AVX512VL}, {2, 0, TF_LAHF},
        {2, 5, TF_LZCNT},
    };
    const uint32_t w[3] = {l1_ecx, l7_ebx, e1_ecx};
    unsigned f = 0;
    for (size_t i = 0; i < sizeof map / sizeof *map; i++)
        if (w[map[i].word] >> map[i].bit & 1u) f |= TF_BIT(map[i].f);
    if (!(f & TF_BIT(TF_OSXSAVE))) xcr0 = 0;
    if ((xcr0 & 0x6) == 0x6) f |= TF_BIT(TF_OS_AVX);      /* SSE, AVX */
    if ((xcr0 & 0xe6) == 0xe6) f |= TF_BIT(TF_OS_AVX512); /* + opmask, ZMM */
    return f;
}

static unsigned cpu_features;
static bool cpu_intel;
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

static void read_cpu(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    unsigned a, b, c, d, l1c = 0, l7b = 0, e1c = 0;
    uint64_t xcr0 = 0;
    if (__get_cpuid(0, &a, &b, &c, &d)) /* "Genu" "ineI" "ntel" in ebx, edx, ecx */
        cpu_intel = b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu;
    if (__get_cpuid(1, &a, &b, &c, &d)) l1c = c;
    if (__get_cpuid_max(0, NULL) >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        l7b = b;
    }
    if (__get_cpuid(0x80000001u, &a, &b, &c, &d)) e1c = c;
    if (l1c >> 27 & 1u) {
        uint32_t lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        xcr0 = (uint64_t)hi << 32 | lo;
    }
    cpu_features = tgt_features_from_cpuid(l1c, l7b, e1c, xcr0);
#endif
}

unsigned tgt_cpu_features(void) {
    pthread_once(&cpu_once, read_cpu);
    return cpu_features;
}

bool tgt_cpu_intel(void) {
    pthread_once(&cpu_once, read_cpu);
    return cpu_intel;
}

const char *tgt_missing(unsigned need, unsigned have, char *buf, size_t n) {
    size_t at = 0;
    if (n) buf[0] = 0;
    for (int f = 0; f < TF_COUNT; f++)
        if ((need & TF_BIT(f)) && !(have & TF_BIT(f)) && at < n)
            at += (size_t)snprintf(buf + at, n - at, "%s%s", at ? ", " : "", feature_names[f]);
    return buf;
}

bool tgt_can_run(TargetTier t, unsigned features) {
    return (features & tgt_tier_needs(t)) == tgt_tier_needs(t);
}

TargetTier tgt_best(unsigned features) {
    for (int t = TGT_V4; t >= TGT_V2; t--)
        if (tgt_can_run((TargetTier)t, features)) return (TargetTier)t;
    return TGT_NATIVE;
}

static const char *const tier_names[TGT_COUNT] = {"v2", "v3", "v4", "native"};

const char *tgt_name(TargetTier t) { return t >= 0 && t < TGT_COUNT ? tier_names[t] : "?"; }

unsigned tgt_ext_of(unsigned features) {
    const unsigned avx2 = TF_BIT(TF_AVX2) | TF_BIT(TF_FMA) | TF_BIT(TF_OS_AVX);
    const unsigned avx512 = TF_BIT(TF_AVX512F) | TF_BIT(TF_AVX512BW) | TF_BIT(TF_AVX512DQ) |
                            TF_BIT(TF_AVX512VL) | TF_BIT(TF_OS_AVX512);
    return ((features & avx2) == avx2 ? EXT_CPU_AVX2 : 0u) |
           ((features & avx512) == avx512 ? EXT_CPU_AVX512 : 0u);
}

int tgt_tier_of(const char *name) {
    for (int t = 0; name && t < TGT_COUNT; t++)
        if (!strcmp(name, tier_names[t])) return t;
    return -1;
}

const char *tgt_valid_names(void) { return "v2, v3, v4, native"; }

kiln_status tgt_make(TargetTier t, unsigned features, Target *out, char *err, size_t errlen) {
    char miss[400];
    memset(out, 0, sizeof *out);
    if (t < 0 || t >= TGT_COUNT) {
        util_fmt(err, errlen, "unknown target tier %d (valid: %s)", (int)t, tgt_valid_names());
        return KILN_ERR_INPUT;
    }
    if (!tgt_can_run(t, features)) {
        util_fmt(err, errlen, "target %s: this CPU cannot run x86-64-%s code: it lacks %s",
                 tier_names[t], tier_names[t],
                 tgt_missing(tgt_tier_needs(t), features, miss, sizeof miss));
        return KILN_ERR_ENV;
    }
    bool avx512 = tgt_can_run(TGT_V4, features), avx2 = tgt_can_run(TGT_V3, features);
    out->tier = t;
    out->name = tier_names[t];
    switch (t) {
    case TGT_V2:
        util_fmt(out->flags, sizeof out->flags, "-march=x86-64-v2 -mtune=native");
        out->lanes = 4;
        break;
    case TGT_V3:
        /* 256-bit vectors even where the tuning prefers 128 (see target.h) */
        util_fmt(out->flags, sizeof out->flags,
                 "-march=x86-64-v3 -mtune=native -mprefer-vector-width=256");
        out->lanes = 8;
        out->ext = EXT_CPU_AVX2;
        break;
    case TGT_V4:
        /* 512-bit vectors even where the tuning prefers 256 (see target.h) */
        util_fmt(out->flags, sizeof out->flags,
                 "-march=x86-64-v4 -mtune=native -mprefer-vector-width=512");
        out->lanes = 16;
        out->ext = EXT_CPU_AVX2 | EXT_CPU_AVX512;
        break;
    default:
        util_fmt(out->flags, sizeof out->flags, "-march=native%s",
                 avx512 ? " -mprefer-vector-width=512"
                 : avx2 ? " -mprefer-vector-width=256"
                        : "");
        out->lanes = avx512 ? 16 : avx2 ? 8 : 4;
        out->ext = tgt_ext_of(features);
        break;
    }
    return KILN_OK;
}

kiln_status tgt_resolve(const char *name, Target *out, char *err, size_t errlen) {
    const char *from = "";
    if (!name || !*name) {
        name = getenv("KILN_TARGET");
        from = "KILN_TARGET: ";
    }
    unsigned f = tgt_cpu_features();
    if (!name || !*name) return tgt_make(tgt_best(f), f, out, err, errlen);
    int t = tgt_tier_of(name);
    if (t < 0) {
        util_fmt(err, errlen, "%sunknown target '%s' (valid: %s)", from, name, tgt_valid_names());
        memset(out, 0, sizeof *out);
        return KILN_ERR_INPUT;
    }
    return tgt_make((TargetTier)t, f, out, err, errlen);
}
