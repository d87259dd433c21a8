/*
 * test_target.c -- the JIT's target tiers (src/base/target.c): features from
 * cpuid words of CPUs described by hand, the tier each allows, the flags,
 * the refusal of a tier the CPU lacks, and what a program compiled for a
 * tier records (its flags in the cache key, its name in the report).
 */
#include "test.h"
#include "runtime/runtime.h"
#include "externs/externs.h"
#include "base/base.h"
#include "testutil.h"

/* cpuid words of CPUs by generation (leaf 1 ecx, leaf 7 ebx, leaf
 * 0x80000001 ecx), bit by bit as the SDM numbers them. */
#define B(n) (1u << (n))
#define L1_CORE2 (B(0) | B(9) | B(13) | B(19)) /* SSE3 SSSE3 CX16 SSE4.1 */
#define L1_NEHALEM (L1_CORE2 | B(20) | B(23))  /* + SSE4.2 POPCNT */
#define L1_HASWELL                                        \
    (L1_NEHALEM | B(12) | B(22) | B(26) | B(27) | B(28) | \
     B(29))                             /* + FMA MOVBE XSAVE OSXSAVE AVX F16C */
#define L7_HASWELL (B(3) | B(5) | B(8)) /* BMI1 AVX2 BMI2 */
#define L7_SKX (L7_HASWELL | B(16) | B(17) | B(28) | B(30) | B(31)) /* + AVX512 F DQ CD BW VL */
#define E1_LZCNT (B(0) | B(5))                                      /* LAHF LZCNT */

static unsigned features(uint32_t l1, uint32_t l7, uint32_t e1, uint64_t xcr0) {
    return tgt_features_from_cpuid(l1, l7, e1, xcr0);
}

TEST(target_tiers_of_cpus) {
    /* Core 2: below v2 */
    CHECK(tgt_best(features(L1_CORE2, 0, 0x1, 0)) == TGT_NATIVE);
    /* Nehalem: v2 */
    CHECK(tgt_best(features(L1_NEHALEM, 0, 0x1, 0)) == TGT_V2);
    /* Haswell with the OS saving AVX state: v3; without it (XCR0 = x87|SSE): v2 */
    CHECK(tgt_best(features(L1_HASWELL, L7_HASWELL, E1_LZCNT, 0x7)) == TGT_V3);
    CHECK(tgt_best(features(L1_HASWELL, L7_HASWELL, E1_LZCNT, 0x3)) == TGT_V2);
    /* Skylake-SP: v4 with the ZMM state saved, else v3 */
    CHECK(tgt_best(features(L1_HASWELL, L7_SKX, E1_LZCNT, 0xe7)) == TGT_V4);
    CHECK(tgt_best(features(L1_HASWELL, L7_SKX, E1_LZCNT, 0x7)) == TGT_V3);
    /* XCR0 is ignored when OSXSAVE is off */
    CHECK(tgt_best(features(L1_HASWELL & ~(1u << 27), L7_SKX, E1_LZCNT, 0xe7)) == TGT_V2);
    /* AVX-512 without BW (Knights Landing): not v4 */
    CHECK(tgt_best(features(L1_HASWELL, L7_SKX & ~(1u << 30), E1_LZCNT, 0xe7)) == TGT_V3);
}

TEST(target_refuses_what_the_cpu_lacks) {
    unsigned hsw = features(L1_HASWELL, L7_HASWELL, E1_LZCNT, 0x7);
    Target t;
    char err[512];
    CHECK(tgt_make(TGT_V4, hsw, &t, err, sizeof err) == KILN_ERR_ENV);
    EXPECT(strstr(err, "target v4: this CPU cannot run x86-64-v4 code: it lacks avx512f, avx512bw, "
                       "avx512cd, avx512dq, avx512vl, AVX-512 state saved by the OS (XCR0)"),
           "%s", err);
    unsigned neh = features(L1_NEHALEM, 0, 0x1, 0);
    CHECK(tgt_make(TGT_V3, neh, &t, err, sizeof err) == KILN_ERR_ENV);
    EXPECT(strstr(err, "it lacks avx, avx2, bmi1, bmi2, f16c, fma, lzcnt, movbe, osxsave"), "%s",
           err);
    CHECK(tgt_make(TGT_V2, features(L1_CORE2, 0, 0x1, 0), &t, err, sizeof err) == KILN_ERR_ENV);
    EXPECT(strstr(err, "it lacks sse4.2, popcnt"), "%s", err);
    /* native needs nothing */
    CHECK(tgt_make(TGT_NATIVE, 0, &t, err, sizeof err) == KILN_OK);
}

TEST(target_flags_and_lanes) {
    unsigned skx = features(L1_HASWELL, L7_SKX, E1_LZCNT, 0xe7);
    unsigned hsw = features(L1_HASWELL, L7_HASWELL, E1_LZCNT, 0x7);
    Target t;
    char err[256];
    CHECK(tgt_make(TGT_V2, skx, &t, err, sizeof err) == KILN_OK);
    CHECK(!strcmp(t.name, "v2") && t.lanes == 4 && t.ext == 0);
    CHECK(!strcmp(t.flags, "-march=x86-64-v2 -mtune=native"));
    CHECK(tgt_make(TGT_V3, skx, &t, err, sizeof err) == KILN_OK);
    CHECK(!strcmp(t.name, "v3") && t.lanes == 8 && t.ext == EXT_CPU_AVX2);
    /* 256-bit vectors whatever -mtune=native prefers (Zen 1 tuning: 128) */
    CHECK(!strcmp(t.flags, "-march=x86-64-v3 -mtune=native -mprefer-vector-width=256"));
    CHECK(tgt_make(TGT_V4, skx, &t, err, sizeof err) == KILN_OK);
    CHECK(!strcmp(t.name, "v4") && t.lanes == 16 && t.ext == (EXT_CPU_AVX2 | EXT_CPU_AVX512));
    /* 512-bit vectors whatever -mtune=native prefers (Skylake-SP tuning: 256) */
    CHECK(strstr(t.flags, "-march=x86-64-v4") && strstr(t.flags, "-mprefer-vector-width=512"));
    CHECK(tgt_make(TGT_NATIVE, skx, &t, err, sizeof err) == KILN_OK);
    CHECK(!strcmp(t.flags, "-march=native -mprefer-vector-width=512") && t.lanes == 16);
    CHECK(tgt_make(TGT_NATIVE, hsw, &t, err, sizeof err) == KILN_OK);
    CHECK(!strcmp(t.flags, "-march=native -mprefer-vector-width=256") && t.lanes == 8 &&
          t.ext == EXT_CPU_AVX2);
}

/* Names: the four tiers, anything else refused with the valid list; the
 * environment is read when no name is given. */
TEST(target_resolve_names) {
    Target t;
    char err[256];
    const char *saved = getenv("KILN_TARGET");
    char keep[64] = "";
    if (saved) snprintf(keep, sizeof keep, "%s", saved);
    CHECK(tgt_resolve("v9", &t, err, sizeof err) == KILN_ERR_INPUT);
    EXPECT(strstr(err, "unknown target 'v9' (valid: v2, v3, v4, native)"), "%s", err);
    setenv("KILN_TARGET", "sse", 1);
    CHECK(tgt_resolve(NULL, &t, err, sizeof err) == KILN_ERR_INPUT);
    EXPECT(strstr(err, "KILN_TARGET: unknown target 'sse'"), "%s", err);
    setenv("KILN_TARGET", "native", 1);
    CHECK(tgt_resolve(NULL, &t, err, sizeof err) == KILN_OK && t.tier == TGT_NATIVE);
    CHECK(tgt_resolve("native", &t, err, sizeof err) == KILN_OK && t.tier == TGT_NATIVE);
    unsetenv("KILN_TARGET");
    CHECK(tgt_resolve(NULL, &t, err, sizeof err) == KILN_OK);
    CHECK(t.tier == tgt_best(tgt_cpu_features()));
    if (saved) setenv("KILN_TARGET", keep, 1);
}

static kiln_graph *small_graph(void) {
    kiln_graph *g = kiln_graph_new();
    kiln_parse(g, "input x: f32[64]\ny = exp(x) * 2\noutput y\n", "t.kiln");
    return g;
}

/* A tier this CPU cannot run fails kiln_compile_with before the compiler
 * runs (CC points nowhere: the error is the tier's, not the compiler's);
 * an unknown name is KILN_ERR_INPUT. */
TEST(target_compile_refused_first) {
    kiln_graph *g = small_graph();
    kiln_options o = kiln_default_options();
    kiln_program *p = NULL;
    o.target = "avx9";
    CHECK(kiln_compile_with(g, &o, &p) == KILN_ERR_INPUT && !p);
    EXPECT(strstr(kiln_error(g), "unknown target 'avx9'"), "%s", kiln_error(g));
    unsigned have = tgt_cpu_features();
    const char *missing = NULL;
    for (int t = TGT_V4; t >= TGT_V2 && !missing; t--)
        if (!tgt_can_run((TargetTier)t, have)) missing = tgt_name((TargetTier)t);
    if (!missing) {
        printf("target_compile_refused_first: this CPU runs every tier; refusal covered above\n");
    } else {
        const char *cc = getenv("CC");
        char keep[256] = "";
        if (cc) snprintf(keep, sizeof keep, "%s", cc);
        setenv("CC", "/nonexistent-cc", 1);
        o.target = missing;
        CHECK(kiln_compile_with(g, &o, &p) == KILN_ERR_ENV && !p);
        EXPECT(strstr(kiln_error(g), "this CPU cannot run") && !strstr(kiln_error(g), "compiler"),
               "%s", kiln_error(g));
        if (cc)
            setenv("CC", keep, 1);
        else
            unsetenv("CC");
    }
    kiln_graph_free(g);
}

/* Each tier is its own cache entry (its flags are in the key), the
 * program records the tier it was compiled for, and the report says so. */
TEST(target_program_records_its_tier) {
    unsigned have = tgt_cpu_features();
    if (!tgt_can_run(TGT_V2, have)) {
        printf("target_program_records_its_tier: not run: this CPU cannot run v2\n");
        return;
    }
    kiln_graph *g = small_graph();
    kiln_options o = kiln_default_options();
    kiln_program *p2 = NULL, *pn = NULL;
    o.target = "v2";
    CHECK(test_compile_in_cache(g, "target-cache", &o, &p2) == KILN_OK);
    o.target = "native";
    CHECK(test_compile_in_cache(g, "target-cache", &o, &pn) == KILN_OK);
    if (p2 && pn) {
        const RtStats *s2 = rt_stats(kiln_program_rt(p2)), *sn = rt_stats(kiln_program_rt(pn));
        CHECK(!strcmp(s2->target, "v2") && !strcmp(sn->target, "native"));
        CHECK(strstr(s2->jit_flags, "-march=x86-64-v2") && strstr(sn->jit_flags, "-march=native"));
        const char *src2 = kiln_program_source(p2), *srcn = kiln_program_source(pn);
        CHECK(!strcmp(src2, srcn)); /* one source, two objects */
        CHECK(!s2->cache_hit && !sn->cache_hit);
        char *json = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&json, &len);
        report_json(f, rt_schedule(kiln_program_rt(p2)), NULL);
        fclose(f);
        EXPECT(json && strstr(json, "\"target\": {\"name\": \"v2\", \"flags\": "
                                    "\"-march=x86-64-v2 -mtune=native\", \"lanes\": 4}"),
               "%s", json ? json : "(none)");
        free(json);
    }
    kiln_program_free(p2);
    kiln_program_free(pn);
    kiln_graph_free(g);
}
