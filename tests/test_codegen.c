/*
 * test_codegen.c -- the generated C source and the runtime's memory plan.
 *
 * Structure: one function per generated kernel under the scheduler's name,
 * kiln_entry calling kernels and extern kernels in the schedule's order, a
 * softmax as one parallel row loop with its three inner loops, row values
 * hoisted out of inner loops, the parallel threshold.
 *
 * Vectorization is proved, not hoped for: the sources of the seed programs
 * (chain, rowsum, siblings, wall, softmax, layernorm, gelu + bias, dropout)
 * and of every transcendental are compiled with the JIT's flags plus
 * -fopt-info-optimized, and GCC must report "loop vectorized" for every
 * innermost loop (each carries CG_INNER_MARK on its `for` line; GCC reports
 * a loop at its pragma, its `for` or its first body line, so any of the
 * three counts) or its replacement by a library call (a plain copy becomes
 * memcpy), and no libm call may survive in the object.
 *
 * Streamed stores: which outputs go through tiles and kiln_stream.
 *
 * Memory planning: a chain of materialized intermediates reuses dead
 * buffers' memory, no two buffers live at once overlap, and the peak is
 * inputs + outputs + arena. Results are checked against the interpreter.
 */
#include "test.h"
#include "testutil.h"
#include "runtime/runtime.h"
#include <unistd.h>

/* ===== helpers ========================================================== */

/* Parse and plan a program with cfg (NULL: the defaults); NULL (with a
 * failure recorded) on error. */
static Plan *plan_cfg(const char *src, const KilnConfig *cfg, kiln_graph **gout) {
    kiln_graph *g = kiln_graph_new();
    Plan *p = NULL;
    char err[1024];
    if (kiln_parse(g, src, "codegen") != KILN_OK) {
        test_failf(__FILE__, __LINE__, "parse: %s", kiln_error(g));
    } else if (plan_build(g, cfg, &p, err, sizeof err) != KILN_OK) {
        test_failf(__FILE__, __LINE__, "plan: %s", err);
        p = NULL;
    }
    if (gout && p)
        *gout = g;
    else
        kiln_graph_free(g);
    return p;
}

static Plan *plan_of(const char *src, kiln_graph **gout) { return plan_cfg(src, NULL, gout); }

static char *read_example(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "examples/%s.kiln", name);
    return test_read_text(path);
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* The text of function `name` (from its signature to the closing brace at
 * column 0), malloc'd; NULL if absent. */
static char *function_text(const char *src, const char *name) {
    char sig[300];
    snprintf(sig, sizeof sig, " %s(", name);
    const char *p = strstr(src, sig);
    /* the definition, not its prototype (the line after the prelude's
     * prototypes ends in ';') */
    while (p && ((strncmp(p - 6, "static", 6) && strncmp(p - 3, "int", 3) &&
                  strncmp(p - 4, "void", 4)) ||
                 (strchr(p, '\n') && strchr(p, '\n')[-1] == ';')))
        p = strstr(p + 1, sig);
    if (!p) return NULL;
    const char *end = strstr(p, "\n}\n");
    if (!end) return NULL;
    size_t n = (size_t)(end - p) + 3;
    char *t = malloc(n + 1);
    memcpy(t, p, n);
    t[n] = 0;
    return t;
}

/* ===== structure ========================================================== */

/* The extern seed as Inductor schedules it (extern epilogues off): three
 * calls; test_epilogue.c has the default (two). */
TEST(codegen_one_function_per_kernel_in_call_order) {
    char *src = read_example("extern");
    CHECK(src);
    KilnConfig cfg = kiln_config_default();
    cfg.extern_epilogue = false;
    Plan *p = plan_cfg(src, &cfg, NULL);
    free(src);
    CHECK(p);
    CgOutput out;
    char err[512];
    CHECKF(cg_generate(p->sched, &out, err, sizeof err) == KILN_OK, "%s", err);
    const Schedule *s = p->sched;
    CHECK(s->nkernels == 3);
    const char *entry = strstr(out.source, "int kiln_entry(");
    CHECK(entry);
    const char *at = entry;
    for (int k = 0; k < s->nkernels; k++) {
        const Kernel *K = &s->kernels[k];
        char call[300];
        if (K->kind == KK_EXTERN) {
            snprintf(call, sizeof call, "%s(", K->kernel); /* the call's comment */
        } else {
            char *fn = function_text(out.source, K->kernel);
            EXPECT(fn != NULL, "no function %s", K->kernel);
            free(fn);
            EXPECT(count(out.source, K->kernel) >= 2, "%s defined and called", K->kernel);
            snprintf(call, sizeof call, "    %s(bufs[", K->kernel);
        }
        const char *here = strstr(at, call);
        EXPECT(here != NULL, "call %d (%s) missing or out of order in kiln_entry", k, K->kernel);
        if (here) at = here + 1;
        EXPECT(!strcmp(out.calls[k].name, K->kernel), "call %d is %s", k, out.calls[k].name);
    }
    EXPECT(strstr(entry, "rt->mm_const(") != NULL, "matmul goes through the runtime table "
                                                   "(mm_const: its b is a weight)");
    EXPECT(!strcmp(s->kernels[0].kernel, "cpp_fused_add_0"), "%s", s->kernels[0].kernel);
    EXPECT(!strcmp(s->kernels[1].kernel, "extern_kernels.mm"), "%s", s->kernels[1].kernel);
    EXPECT(!strcmp(s->kernels[2].kernel, "cpp_fused_relu_1"), "%s", s->kernels[2].kernel);
    cg_free(&out);
    plan_free(p);
}

/* softmax: one kernel, one parallel loop over rows, three inner loops
 * (max, exp + sum, div), the exp kept in a per-thread row. */
TEST(codegen_softmax_is_one_row_loop) {
    char *src = read_example("softmax");
    CHECK(src);
    Plan *p = plan_of(src, NULL);
    free(src);
    CHECK(p);
    CgOutput out;
    char err[512];
    CHECKF(cg_generate(p->sched, &out, err, sizeof err) == KILN_OK, "%s", err);
    CHECK(p->sched->nkernels == 1);
    char *fn = function_text(out.source, p->sched->kernels[0].kernel);
    CHECK(fn);
    EXPECT(count(fn, "#pragma omp for") + count(fn, "#pragma omp parallel for") == 1,
           "one parallel loop:\n%s", fn);
    EXPECT(count(fn, CG_INNER_MARK) == 3, "three inner loops:\n%s", fn);
    /* the max by an omp simd reduction; the sum, in the blocked second
     * pass, in 16 lanes combined after the blocks (spread_stage) */
    EXPECT(count(fn, "reduction(max:") == 1 && count(fn, "reduction(+:") == 0 &&
               count(fn, "lane_acc_buf2[r0 - r0v] += tmp3;") == 1 &&
               count(fn, "for (int l = 0; l < 16; l++) acc_buf2 += lane_acc_buf2[l];") == 1,
           "%s", fn);
    EXPECT(count(fn, "kiln_expf_v(") == 1, "exp computed once per element:\n%s", fn);
    EXPECT(count(fn, "float row_") == 1, "one row-local scratch:\n%s", fn);
    EXPECT(out.calls[0].inner_loops == 3 && out.calls[0].parallel, "call info");
    /* row prefetch: after the first pass over the row (max), the second
     * runs in blocks of 256, each asking for its part of the next row's x,
     * and in groups of 16 (the lanes) within a block */
    const char *blk = strstr(fn, "for (int64_t r0b = 0; r0b < 1024; r0b += 256) {");
    const char *pf = strstr(fn, "if (x0 + 1 < 1024) kiln_prefetch(&in_x[1024*(x0 + 1) + (r0b)], "
                                "r0b + 256 < 1024 ? 256 : 1024 - r0b);");
    const char *mark1 = strstr(fn, CG_INNER_MARK),
               *mark2 = mark1 ? strstr(mark1 + 1, CG_INNER_MARK) : NULL;
    EXPECT(
        blk && pf && count(fn, "kiln_prefetch(") == 1 && mark1 < blk && blk < pf && pf < mark2 &&
            strstr(
                fn,
                "for (int64_t r0v = r0b; r0v < (r0b + 256 < 1024 ? r0b + 256 : 1024); r0v += 16) {") &&
            strstr(fn, "for (int64_t r0 = r0v; r0 < r0v + 16; r0++) {  " CG_INNER_MARK),
        "the next row prefetched block by block in the second pass:\n%s", fn);
    free(fn);
    cg_free(&out);
    plan_free(p);
}

/* The blocked second pass of a row kernel (row prefetch) reduces in 16
 * lanes when its rows are a multiple of 16 long: each lane accumulates
 * across the blocks, no omp reduction clause, and the lanes combine after
 * the blocks (max and min with their NaN flags). Sum, product, max and
 * min, in float and with CgOptions.double_acc (lanes in double); the
 * sources compile. Rows of 1000 keep the omp reduction. test_fused.c
 * checks the values (fused_lane_reductions). */
TEST(codegen_lane_reductions) {
    static const char *const red[] = {"sum", "prod", "amax", "amin"};
    for (int r = 0; r < 4; r++)
        for (int len = 1000; len <= 1024; len += 24)
            for (int dbl = 0; dbl < 2; dbl++) {
                char src[300];
                snprintf(src, sizeof src,
                         "input x: f32[600, %d]\nm = mean(x, dim=1, keepdim=true)\n"
                         "a = %s(%s, dim=1, keepdim=true)\ny = x * a\noutput y\n",
                         len, red[r], r == 1 ? "1 + (x - m) * 0.001" : "x - m");
                Plan *p = plan_of(src, NULL);
                CHECK(p);
                CgOptions opt = {.double_acc = dbl};
                CgOutput out;
                char err[512];
                CHECK(cg_generate_opts(p->sched, &opt, &out, err, sizeof err) == KILN_OK);
                bool lanes = len == 1024, minmax = r >= 2;
                const char *k = strstr(out.source, "/* ===== kernels");
                CHECK(k);
                char decl[64];
                snprintf(decl, sizeof decl, "%s lane_acc_buf1[16];",
                         dbl && !minmax ? "double" : "float");
                EXPECT((strstr(k, decl) != NULL) == lanes &&
                           (strstr(k, "lane_nan_buf1[16]") != NULL) == (lanes && minmax) &&
                           (strstr(k, "r0v += 16") != NULL) == lanes &&
                           count(k, "reduction(") == (lanes    ? 1
                                                      : minmax ? 3
                                                               : 2) &&
                           strstr(k, "r0b += 256"),
                       "%s, rows of %d, double_acc %d: lanes %s:\n%s", red[r], len, dbl,
                       lanes ? "wanted" : "not wanted", k);
                char name[64], c[600], o[600], *report = NULL;
                snprintf(name, sizeof name, "lanes_%s_%d_%d", red[r], len, dbl);
                EXPECT(test_compile_report(name, out.source, c, o, &report) == 0,
                       "%s does not compile", c);
                free(report);
                cg_free(&out);
                plan_free(p);
            }
}

/* Row pairs: a one-stage row reduction over rows of >= CG_PAIR_MIN elements
 * and an even row count runs two rows per iteration of the row loop, each
 * with its own accumulators in one inner loop (row steps too, like mean's
 * scale); odd counts, short rows, fewer than 2 * CG_PARALLEL_ITERS rows and
 * kernels of several inner stages (layer_norm) run a row at a time. */
static char *kernel0_text(const char *src) {
    Plan *p = plan_of(src, NULL);
    if (!p) return NULL;
    CgOutput out;
    char err[512], *fn = NULL;
    if (cg_generate(p->sched, &out, err, sizeof err) == KILN_OK) {
        fn = function_text(out.source, p->sched->kernels[0].kernel);
        cg_free(&out);
    }
    plan_free(p);
    return fn;
}

/* Row pairs follow KilnConfig.row_pairs: KILN_ROW_PAIRS=1 or 0 forces them
 * on or off, unset they are on for Intel CPUs alone; an unknown value
 * leaves the CPU's default. The tests below force them on. */
TEST(codegen_row_pairs_switch) {
    static const char *src = "input x: f32[512, 1024]\ns = sum(x, dim=1)\noutput s\n";
    unsetenv("KILN_ROW_PAIRS");
    CHECK(kiln_config_default().row_pairs == tgt_cpu_intel());
    setenv("KILN_ROW_PAIRS", "yes", 1);
    CHECK(kiln_config_default().row_pairs == tgt_cpu_intel());
    setenv("KILN_ROW_PAIRS", "0", 1);
    CHECK(!kiln_config_default().row_pairs);
    char *fn = kernel0_text(src);
    CHECK(fn);
    EXPECT(count(fn, "x0++") == 1 && !strstr(fn, "(x0 + 1) + r0]"), "KILN_ROW_PAIRS=0:\n%s", fn);
    free(fn);
    setenv("KILN_ROW_PAIRS", "1", 1);
    CHECK(kiln_config_default().row_pairs);
    fn = kernel0_text(src);
    CHECK(fn);
    EXPECT(count(fn, "x0 += 2") == 1, "KILN_ROW_PAIRS=1:\n%s", fn);
    free(fn);
    unsetenv("KILN_ROW_PAIRS");
}

TEST(codegen_row_pairs) {
    setenv("KILN_ROW_PAIRS", "1", 1);
    char *fn = kernel0_text(
        "input x: f32[512, 1024]\nm = amax(x, dim=1)\ns = sum(x, dim=1)\noutput m, s\n");
    CHECK(fn);
    EXPECT(count(fn, "x0 += 2") == 1 && count(fn, "in_x[1024*(x0 + 1) + r0]") == 1, "%s", fn);
    EXPECT(count(fn, CG_INNER_MARK) == 1 && count(fn, "reduction(max:") == 2 &&
               count(fn, "reduction(+:acc_buf1_1)") == 1 && count(fn, "if (nan_buf0_1)") == 1,
           "one inner loop for both rows:\n%s", fn);
    free(fn);
    fn = kernel0_text("input x: f32[512, 1024]\nv = mean(x * x, dim=1)\noutput v\n");
    CHECK(fn);
    EXPECT(count(fn, "x0 += 2") == 1 && count(fn, "buf1[(x0 + 1)] = ") == 1,
           "a row step in pairs:\n%s", fn);
    free(fn);
    static const char *const single[] = {
        "input x: f32[511, 1024]\ns = sum(x, dim=1)\noutput s\n",
        "input x: f32[512, 512]\ns = sum(x, dim=1)\noutput s\n",
        "input x: f32[510, 1024]\ns = sum(x, dim=1)\noutput s\n",
        "input x: f32[512, 1024]\ny = layer_norm(x, [1024])\noutput y\n",
    };
    for (int i = 0; i < 4; i++) {
        fn = kernel0_text(single[i]);
        CHECK(fn);
        EXPECT(count(fn, "x0++") == 1 && !strstr(fn, "(x0 + 1) + r0]") && !strstr(fn, "_1 "),
               "a row at a time:\n%s", fn);
        free(fn);
    }
    unsetenv("KILN_ROW_PAIRS");
}

/* layer_norm: rsqrt(var + eps) depends only on the row, so it is computed
 * between the inner loops, never inside one. */
/* A matmul's entry: mm_const when b is a weight (the library may keep it
 * in its own layout), mm when b is a runtime input. */
TEST(codegen_matmul_const_entry) {
    Plan *p = plan_of("input x: f32[8, 16]\ninput v: f32[16, 4]\n"
                      "weight w: f32[16, 4] = randn(2)\ny = x @ w\nz = x @ v\noutput y, z\n",
                      NULL);
    CHECK(p);
    CgOutput out;
    char err[512];
    CHECKF(cg_generate(p->sched, &out, err, sizeof err) == KILN_OK, "%s", err);
    EXPECT(count(out.source, "rt->mm_const(") == 1 && count(out.source, "rt->mm(") == 1,
           "entry:\n%s", strstr(out.source, "kiln_entry"));
    cg_free(&out);
    plan_free(p);
}

TEST(codegen_hoists_row_values) {
    char *src = read_example("layernorm");
    CHECK(src);
    Plan *p = plan_of(src, NULL);
    free(src);
    CHECK(p);
    CgOutput out;
    char err[512];
    CHECKF(cg_generate(p->sched, &out, err, sizeof err) == KILN_OK, "%s", err);
    char *fn = function_text(out.source, p->sched->kernels[0].kernel);
    CHECK(fn);
    const char *sq = strstr(fn, "sqrtf(");
    CHECK(sq);
    /* the line holding sqrtf is indented like the statements of the row loop
     * (4 more than `for (x0)`), not like an inner loop's body */
    const char *bol = sq, *row = strstr(fn, "for (int64_t x0 ");
    CHECK(row);
    while (bol > fn && bol[-1] != '\n') bol--;
    while (row > fn && row[-1] != '\n') row--;
    int indent = 0, row_indent = 0;
    while (bol[indent] == ' ') indent++;
    while (row[row_indent] == ' ') row_indent++;
    EXPECT(indent == row_indent + 4, "sqrtf at indent %d, the row loop at %d:\n%s", indent,
           row_indent, fn);
    EXPECT(count(fn, "sqrtf(") == 1, "%s", fn);
    free(fn);
    cg_free(&out);
    plan_free(p);
}

/* sum(x, dim=0): the reduced dim is strided, so the parallel dim's loop
 * moves inside it over blocks, with an accumulator per element; a row step
 * (mean's scale) runs in the loop that stores the block. */
TEST(codegen_column_reduction_outer_order) {
    Plan *p = plan_of("input x: f32[1000, 300]\nc = mean(x, dim=0)\nr = amax(x, dim=1)\n"
                      "output c, r\n",
                      NULL);
    CHECK(p);
    CgOutput out;
    char err[512];
    CHECK(cg_generate(p->sched, &out, err, sizeof err) == KILN_OK);
    const Schedule *s = p->sched;
    CHECK(s->nkernels == 2);
    char *col = NULL, *row = NULL;
    for (int k = 0; k < 2; k++) {
        char *fn = function_text(out.source, s->kernels[k].kernel);
        CHECK(fn);
        if (strstr(fn, "reduction(max:"))
            row = fn;
        else
            col = fn;
    }
    CHECK(col && row);
    EXPECT(strstr(out.source, "outer reduction (blocks of 128)"), "%s", col);
    EXPECT(strstr(col, "float acc_buf0[128];"), "%s", col);
    const char *xl =
        strstr(col, "for (int64_t x0 = x0b; x0 < (x0b + 128 < 300 ? x0b + 128 : 300); x0++)");
    EXPECT(xl && strstr(xl, CG_INNER_MARK) < strchr(xl, '\n'), "%s", col);
    EXPECT(strstr(col, "[x0 + 300*r0]"), "contiguous along the inner loop:\n%s", col);
    EXPECT(count(col, CG_INNER_MARK) == 2, "accumulate and store loops:\n%s", col);
    EXPECT(!strstr(row, "outer reduction"), "a row reduction keeps the row order:\n%s", row);
    free(col);
    free(row);
    cg_free(&out);
    plan_free(p);
}

/* A transposed read walks the last two loops in tiles; the column blocks
 * (x1b) outside the row blocks (x0b), so consecutive tiles go on along the
 * read's contiguous dim (x0). */
TEST(codegen_transpose_tiled) {
    Plan *p = plan_of("input x: f32[300, 200]\ny = transpose(x, 0, 1) + 1\noutput y\n", NULL);
    CHECK(p);
    CgOutput out;
    char err[512];
    CHECK(cg_generate(p->sched, &out, err, sizeof err) == KILN_OK);
    char *fn = function_text(out.source, p->sched->kernels[0].kernel);
    CHECK(fn);
    const char *rows = strstr(fn, "for (int64_t x0b = 0; x0b < 200; x0b += 32)");
    const char *cols = strstr(fn, "for (int64_t x1b = 0; x1b < 300; x1b += 32)");
    EXPECT(rows && cols && cols < rows, "column blocks outside row blocks:\n%s", fn);
    EXPECT(strstr(fn, "in_x[x0 + 200*x1]"), "%s", fn);
    EXPECT(count(fn, CG_INNER_MARK) == 1, "%s", fn);
    free(fn);
    cg_free(&out);
    plan_free(p);
}

TEST(codegen_parallel_only_when_big) {
    Plan *small =
        plan_of("input x: f32[16, 16]\ny = sin(x)\ns = sum(x, dim=1)\noutput y, s\n", NULL);
    Plan *big =
        plan_of("input x: f32[512, 512]\ny = sin(x)\ns = sum(x, dim=1)\noutput y, s\n", NULL);
    CHECK(small && big);
    CgOutput a, b;
    char err[512];
    CHECK(cg_generate(small->sched, &a, err, sizeof err) == KILN_OK);
    CHECK(cg_generate(big->sched, &b, err, sizeof err) == KILN_OK);
    EXPECT(!strstr(a.source, "#pragma omp parallel"), "16x16 runs serially");
    EXPECT(strstr(b.source, "#pragma omp parallel"), "512x512 runs in parallel");
    for (int i = 0; i < a.ncalls; i++) EXPECT(!a.calls[i].parallel, "call %d", i);
    cg_free(&a);
    cg_free(&b);
    plan_free(small);
    plan_free(big);
}

/* Transcendentals go to vecmath.h; pow by a small integer is multiplication. */
/* The kernels' part of p's generated source (out freed by the caller). */
static const char *kernel_text(Plan *p, CgOutput *out) {
    char err[512];
    if (cg_generate(p->sched, out, err, sizeof err) != KILN_OK) return NULL;
    return strstr(out->source, "/* ===== kernels");
}

/* div by a row value is a reciprocal multiply (computed once per row);
 * true_divide is a division in the inner loop. */
TEST(codegen_true_divide_divides) {
    for (int t = 0; t < 2; t++) {
        Plan *p = plan_of(t ? "input x: f32[8, 64]\ns = sum(x, 1, keepdim=true)\n"
                              "y = true_divide(x, s)\noutput y\n"
                            : "input x: f32[8, 64]\ns = sum(x, 1, keepdim=true)\n"
                              "y = x / s\noutput y\n",
                          NULL);
        CHECK(p);
        CgOutput out;
        const char *k = kernel_text(p, &out);
        CHECK(k);
        EXPECT(!strstr(k, "kiln_rcp_scale(") == (t == 1), "%s: reciprocal %s:\n%s",
               t ? "true_divide" : "div", t ? "used" : "missing", k);
        cg_free(&out);
        plan_free(p);
    }
}

TEST(codegen_math_forms) {
    Plan *p = plan_of("input x: f32[64]\ny = exp(x) + log(x) + sin(x) + cos(x) + tanh(x) + erf(x)\n"
                      "z = pow(x, 3) + pow(x, -2) + pow(x, 0.5)\noutput y, z\n",
                      NULL);
    CHECK(p);
    CgOutput out;
    const char *k = kernel_text(p, &out);
    CHECK(k);
    static const char *want[] = {"kiln_expf_v(",       "kiln_logf_v(",        "kiln_sinf_v(",
                                 "kiln_cosf_v(",       "kiln_tanhf_v(",       "kiln_erff_v(",
                                 "kiln_powi(tmp0, 3)", "kiln_powi(tmp0, -2)", "kiln_pow_half("};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        EXPECT(strstr(k, want[i]), "%s missing:\n%s", want[i], k);
    static const char *libm[] = {" expf(",  " logf(", " sinf(", " cosf(",
                                 " tanhf(", " erff(", "powf("};
    for (size_t i = 0; i < sizeof libm / sizeof *libm; i++)
        EXPECT(!strstr(k, libm[i]), "libm call %s in:\n%s", libm[i], k);
    cg_free(&out);
    plan_free(p);
}

/* vecmath.h's AVX-512 exp, gelu and sigmoid (KILN_VM_EXP_DISPATCH,
 * KILN_VM_GELU_DISPATCH, KILN_VM_SIGMOID_DISPATCH) are compiled into the
 * programs that call exp or tanh, gelu, or sigmoid, and left out of the
 * others (KILN_VM_NO_EXP_DISPATCH, KILN_VM_NO_GELU_DISPATCH and
 * KILN_VM_NO_SIGMOID_DISPATCH, to save compile time: docs/decisions.md,
 * Unused vector variants left out of the prelude). Those programs
 * run against the interpreter over exp's whole range: rows of 14 (8-wide
 * vectors: the padded narrow variant), rows of 1000 (16-wide), tanh, gelu,
 * sigmoid, and the values where exp overflows, underflows, turns denormal, inf, NaN. */
TEST(codegen_exp_dispatch) {
    static const struct {
        const char *src;
        bool exp, gelu, sigmoid;
    } progs[] = {
        {"input x: f32[64, 14]\ny = exp(x)\noutput y\n", true, false, false},
        {"input x: f32[8, 100]\ny = tanh(x) * 2\noutput y\n", true, false, false},
        {"input x: f32[8, 100]\ny = softmax(x, dim=1)\noutput y\n", true, false, false},
        {"input x: f32[8, 100]\ny = sum(sin(x), dim=1)\noutput y\n", false, false, false},
        {"input x: f32[8, 100]\ny = gelu(x) + sigmoid(x)\noutput y\n", false, true, true},
        {"input x: f32[8, 100]\ny = x * sigmoid(x)\noutput y\n", false, false, true},
    };
    for (size_t i = 0; i < sizeof progs / sizeof *progs; i++) {
        Plan *p = plan_of(progs[i].src, NULL);
        CHECK(p);
        CgOutput out;
        char err[512];
        CHECK(cg_generate(p->sched, &out, err, sizeof err) == KILN_OK);
        EXPECT(!strstr(out.source, "#define KILN_VM_NO_EXP_DISPATCH") == progs[i].exp,
               "program %zu: exp dispatch %s", i, progs[i].exp ? "left out" : "compiled in");
        EXPECT(!strstr(out.source, "#define KILN_VM_NO_GELU_DISPATCH") == progs[i].gelu,
               "program %zu: gelu dispatch %s", i, progs[i].gelu ? "left out" : "compiled in");
        EXPECT(!strstr(out.source, "#define KILN_VM_NO_SIGMOID_DISPATCH") == progs[i].sigmoid,
               "program %zu: sigmoid dispatch %s", i,
               progs[i].sigmoid ? "left out" : "compiled in");
        cg_free(&out);
        plan_free(p);
    }
    static const float special[] = {0.0f,
                                    -0.0f,
                                    1.0f,
                                    -1.0f,
                                    88.72283935546875f,
                                    88.7228394f,
                                    89.0f,
                                    100.0f,
                                    -87.33654f,
                                    -95.5f,
                                    -103.97207f,
                                    -103.97283935546875f,
                                    -104.0f,
                                    -110.0f,
                                    INFINITY,
                                    -INFINITY,
                                    NAN,
                                    1e-40f,
                                    3e38f,
                                    -3e38f};
    static const int64_t shapes[][2] = {{64, 14}, {3, 1000}};
    for (int s = 0; s < 2; s++) {
        TestProg P = {.g = kiln_graph_new()};
        kiln_value x = test_prog_input(&P, "x", 2, shapes[s], 70);
        CHECK(x >= 0);
        float *d = P.in[0].data;
        int64_t n = shapes[s][0] * shapes[s][1];
        for (int64_t k = 0; k < n; k++) /* -115 .. 95 in uneven steps, specials among them */
            d[k] = k % 7 == 3 ? special[(k / 7) % (int64_t)(sizeof special / sizeof *special)]
                              : -115.0f + 210.0f * (float)((k * 7919) % n) / (float)n;
        CHECK(kiln_output(P.g, kiln_unary(P.g, "exp", x), "y") == KILN_OK);
        CHECK(kiln_output(P.g, kiln_unary(P.g, "tanh", kiln_unary(P.g, "neg", x)), "t") == KILN_OK);
        CHECK(kiln_output(P.g, kiln_unary(P.g, "gelu", x), "g") == KILN_OK);
        CHECK(kiln_output(P.g, kiln_unary(P.g, "sigmoid", x), "s") == KILN_OK);
        test_prog_check(&P, "exp-dispatch-cache", NULL, NULL);
        test_prog_free(&P);
    }
}

/* Short constant rows get 8-wide vectors where 16-wide ones would leave a
 * long scalar remainder (want_simd8): n / 8 + n % 8 < n / 16 + n % 16. A
 * broadcast row (x * b) keeps its own inner loop of n; the strided max
 * pool over rows of 56 (loads 2 apart) gets `omp simd simdlen(8)`, and
 * both match the interpreter (max pool bit for bit). */
TEST(codegen_short_rows_simdlen8) {
    static const struct {
        int64_t n;
        bool want;
    } rows[] = {{14, true}, {28, true},  {56, true},  {24, true},
                {7, false}, {49, false}, {64, false}, {112, false}};
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        char src[200];
        snprintf(src, sizeof src,
                 "input x: f32[64, %lld]\ninput b: f32[64, 1]\ny = exp(x) * b\noutput y\n",
                 (long long)rows[i].n);
        char *fn = kernel0_text(src);
        CHECK(fn);
        char want[100];
        snprintf(want, sizeof want,
                 "#pragma omp simd simdlen(8)\n        for (int64_t x1 = 0; x1 < %lld;",
                 (long long)rows[i].n);
        EXPECT((strstr(fn, want) != NULL) == rows[i].want &&
                   (count(fn, "simdlen(8)") == rows[i].want),
               "rows of %lld: simdlen(8) %s:\n%s", (long long)rows[i].n,
               rows[i].want ? "wanted" : "not wanted", fn);
        free(fn);
    }
    static const char *const progs[] = {
        "input x: f32[2, 3, 112, 112]\ny = max_pool2d(x, 3, stride=2, padding=1)\noutput y\n",
        "input x: f32[5, 28]\ninput b: f32[5, 1]\ny = tanh(x) * b + sin(x)\noutput y\n",
    };
    for (int i = 0; i < 2; i++) {
        Plan *p = plan_of(progs[i], NULL);
        CHECK(p);
        CgOutput out;
        char err[512];
        CHECK(cg_generate(p->sched, &out, err, sizeof err) == KILN_OK);
        EXPECT(count(out.source, "#pragma omp simd simdlen(8)\n") == 1, "program %d:\n%s", i,
               out.source);
        cg_free(&out);
        plan_free(p);
        TestProg P = {0};
        P.g = kiln_graph_new();
        CHECK(kiln_parse(P.g, progs[i], "simd8") == KILN_OK);
        for (P.nin = 0; P.nin < kiln_num_inputs(P.g); P.nin++) {
            P.in[P.nin] = kiln_input_desc(P.g, P.nin);
            CHECK(kiln_tensor_alloc(&P.in[P.nin]) == KILN_OK);
            kiln_fill_randn(P.in[P.nin].data, kiln_tensor_numel(&P.in[P.nin]),
                            40 + (uint64_t)P.nin);
        }
        test_prog_check(&P, "codegen-simd8-cache", NULL, i == 0 ? "y" : NULL);
        test_prog_free(&P);
    }
}

/* ===== vectorization proof ====================================================== */

/* Compile source with the JIT's flags and GCC's vectorization report; check
 * every marked inner loop. Returns the number of marked loops (-1 on a
 * compile failure). */
/* Does the loop whose header is at p hold a guarded load (`c ? x[i] : 0`,
 * a pad's or a pool window's border)? Up to its closing brace. */
static bool loop_has_guarded_load(const char *p) {
    int depth = 0;
    for (; *p; p++) {
        if (*p == '{') depth++;
        if (*p == '}' && --depth <= 0) return false;
        if (p[0] == '?' && p[1] == ' ') {
            const char *q = p + 2;
            while (*q == '_' || (*q >= 'a' && *q <= 'z') || (*q >= '0' && *q <= '9')) q++;
            if (*q == '[' && q > p + 2) return true;
        }
    }
    return false;
}

/* Compile source with flags and count the inner loops GCC did not
 * vectorize. At x86-64-v2 (exempt_guarded), a loop with a guarded load
 * is exempt and counted in *exempt: SSE4.2 has no masked load, so GCC
 * cannot if-convert a load that may fault (AVX's vmaskmovps and AVX-512's
 * masks can), and such loops stay scalar there. */
static int check_vectorized_ex(const char *name, const char *flags, const char *source, int *missed,
                               bool exempt_guarded, int *exempt);

static bool vec_quiet; /* no line per missed loop (a control that is expected to miss) */

static int check_vectorized(const char *name, const char *flags, const char *source, int *missed) {
    int exempt = 0;
    return check_vectorized_ex(name, flags, source, missed, false, &exempt);
}

static int check_vectorized_ex(const char *name, const char *flags, const char *source, int *missed,
                               bool exempt_guarded, int *exempt) {
    char c[600], o[600], cmd[3000], vname[300];
    char *report = NULL;
    unsigned h = 5381;
    for (const char *f = flags; *f; f++) h = h * 33 + (unsigned char)*f;
    snprintf(vname, sizeof vname, "vec_%s_%08x", name, h);
    if (test_compile_report_with(vname, source, flags, c, o, &report) != 0) return -1;
    int marks = 0, line = 1;
    *missed = 0;
    for (const char *p = source; *p; p++) {
        if (*p == '\n') {
            line++;
            continue;
        }
        if (strncmp(p, CG_INNER_MARK, strlen(CG_INNER_MARK))) continue;
        marks++;
        /* GCC reports a loop at its pragma, its `for` or its first body
         * line that is left; in a range of a split loop (row_nest_text) the
         * first lines may be loads the range never takes, gone: any line
         * of the loop's body counts */
        int body = 0;
        for (const char *q = strchr(p, '\n'); q && q[1] && !strchr("}", q[1 + strspn(q + 1, " ")]);
             q = strchr(q + 1, '\n'))
            body++;
        bool vec = false;
        for (int l = line; l <= line + body && !vec; l++)
            vec = test_vectorized_at(report, c, l, true);
        if (!vec) {
            if (exempt_guarded && loop_has_guarded_load(p)) {
                (*exempt)++;
                continue;
            }
            if (!vec_quiet)
                printf("  %s: inner loop at %s:%d not vectorized (%s)\n", name, c, line, flags);
            (*missed)++;
        }
    }
    free(report);
    /* no libm call may survive (sqrtf/floorf/... are instructions) */
    snprintf(cmd, sizeof cmd,
             "nm -u '%s' | grep -E ' (expf|logf|sinf|cosf|tanhf|erff|sqrtf|floorf|"
             "ceilf|fabsf)$' > '%s.libm'",
             o, o);
    if (system(cmd) == 0) {
        printf("  %s: libm calls left in the object (see %s.libm)\n", name, o);
        (*missed)++;
    }
    return marks;
}

/* The generated C of example `name` (src NULL) or of the program src in
 * *out; returns its plan (free it after cg_free), or NULL (a failure
 * recorded). */
static Plan *generate_program(const char *name, const char *src, CgOutput *out) {
    char *text = src ? strdup(src) : read_example(name);
    char err[512];
    EXPECT(text, "no program %s", name);
    if (!text) return NULL;
    Plan *p = plan_of(text, NULL);
    free(text);
    if (!p) return NULL;
    if (cg_generate(p->sched, out, err, sizeof err) == KILN_OK) return p;
    EXPECT(0, "%s: %s", name, err);
    plan_free(p);
    return NULL;
}

TEST(codegen_inner_loops_vectorized) {
    static const char *examples[] = {"chain",     "rowsum",    "siblings", "wall",       "softmax",
                                     "layernorm", "gelu_bias", "dropout",  "wall_chain", "layout"};
    static const struct {
        const char *name, *src;
    } extra[] = {
        {"unary", "input x: f32[1000]\ny = exp(x) + log(x) + sin(x) + cos(x) + tanh(x) + erf(x)"
                  " + sigmoid(x) + sqrt(x) + floor(x) + ceil(x) + abs(x) + rsqrt(x)\noutput y\n"},
        {"minmax", "input x: f32[300, 77]\na = amax(x, dim=1)\nb = amin(x, dim=1)\n"
                   "c = prod(x, dim=1)\noutput a, b, c\n"},
        {"bcast", "input x: f32[64, 100]\ninput b: f32[64, 1]\ny = where(x > b, x * b, -x)\n"
                  "output y\n"},
        /* rows of 56: 8-wide (want_simd8); the pool's loads 2 apart */
        {"rows56",
         "input x: f32[64, 56]\ninput b: f32[64, 1]\ny = exp(x) * b + sin(x)\noutput y\n"},
        {"pool56", "input x: f32[2, 3, 112, 112]\ny = max_pool2d(x, 3, stride=2, padding=1)\n"
                   "output y\n"},
        /* ocr_det's FPN: nearest 8x, 4x and 2x upsamples (expand and
         * reshape) concatenated along channels: loads guarded by tests of
         * the channel, which the inner loop does not change; GCC 12 leaves
         * the loop scalar ("no vectype for stmt: .MASK_LOAD") unless it
         * unswitches it first (CG_GCC_FLAGS) */
        {"split3", "input a: f32[3, 40]\ninput b: f32[5, 40]\ninput c: f32[2, 40]\n"
                   "y = exp(cat([a, b * 2, c], dim=0))\noutput y\n"},
        {"upcat", "input p: f32[1, 24, 10, 10]\ninput q: f32[1, 24, 20, 20]\n"
                  "input r: f32[1, 24, 40, 40]\ninput s: f32[1, 24, 80, 80]\n"
                  "p8 = reshape(expand(reshape(p, [1, 24, 10, 1, 10, 1]), [1, 24, 10, 8, 10, 8]), "
                  "[1, 24, 80, 80])\n"
                  "q4 = reshape(expand(reshape(q, [1, 24, 20, 1, 20, 1]), [1, 24, 20, 4, 20, 4]), "
                  "[1, 24, 80, 80])\n"
                  "r2 = reshape(expand(reshape(r, [1, 24, 40, 1, 40, 1]), [1, 24, 40, 2, 40, 2]), "
                  "[1, 24, 80, 80])\n"
                  "u = cat([p8, q4, r2, s], dim=1)\noutput u\n"},
    };
    int nex = (int)(sizeof examples / sizeof *examples), total = 0, missed_all = 0, exempt = 0;
    for (int i = 0; i < nex + (int)(sizeof extra / sizeof *extra); i++) {
        const char *name = i < nex ? examples[i] : extra[i - nex].name;
        CgOutput out;
        Plan *p = generate_program(name, i < nex ? NULL : extra[i - nex].src, &out);
        if (p) {
            /* every tier, whether this CPU runs it or not: vectorization
             * is the compiler's decision */
            for (int t = TGT_V2; t <= TGT_V4; t++) {
                int missed = 0, marks = check_vectorized_ex(name, test_tier_flags(t), out.source,
                                                            &missed, t == TGT_V2, &exempt);
                EXPECT(marks > 0, "%s: no inner loops found or the compile failed (%s)", name,
                       test_tier_flags(t));
                total += marks > 0 ? marks : 0;
                missed_all += missed;
            }
            cg_free(&out);
            plan_free(p);
        }
    }
    EXPECT(missed_all == 0, "%d of %d inner loops not vectorized (or libm calls left)", missed_all,
           total);
    printf("codegen: %d inner loops at v2, v3 and v4 (compiled for each), %d at v2 with guarded "
           "loads left scalar (no masked load in SSE4.2)\n",
           total, exempt);
}

/* The serial kernel of a concat along its first dim runs that loop as
 * consecutive loops over the ranges where the concat's guards are
 * constant (row_nest_text in codegen.c): three inputs, three ranges; the
 * concat seen reversed (its guards' index falls as x0 grows), three; 45
 * inputs, 45; a parallel kernel (large) and a concat along the inner dim
 * stay one loop. The split loops vectorize (the vectorization test below
 * compiles "split3"). */
static const char *const split_progs[][2] = {
    {"3", "input a: f32[3, 40]\ninput b: f32[5, 40]\ninput c: f32[2, 40]\n"
          "y = cat([a, b * 2, c], dim=0)\noutput y\n"},
    {"3", "input a: f32[3, 40]\ninput b: f32[5, 40]\ninput c: f32[2, 40]\n"
          "y = slice(cat([a, b, c], dim=0), 0, -1, -1000, step=-1) + 1\noutput y\n"},
    {"0", "input a: f32[300, 4000]\ninput b: f32[500, 4000]\ny = cat([a, b], dim=0) * 3\n"
          "output y\n"},
    {"0", "input a: f32[3, 40]\ninput b: f32[3, 24]\ny = cat([a, b], dim=1)\noutput y\n"},
};

/* A pointwise kernel whose loads are guarded by tests of its last dim
 * alone (a pad, a concat along the last dim) runs its innermost loop as
 * consecutive loops between the points where a test changes (inner_splits
 * in codegen.c), the parts shorter than a vector marked as such: a pool's
 * padded input, 2 points, and a pad on one side, 1, each with short
 * parts; a concat along the inner dim, 1 (parts of 40 and 24); nothing
 * guarded, and a row reduction, none. */
static const char *const inner_progs[][2] = {
    {"x2 split at 2 points", "input x: f32[2, 8, 64, 60]\n"
                             "y = max_pool2d(relu(x), 3, stride=2, padding=1)\noutput y\n"},
    {"x1 split at 1 point", "input x: f32[40, 50]\ny = pad(x, [3, 0]) * 2\noutput y\n"},
    {"x1 split at 1 point",
     "input a: f32[3, 40]\ninput b: f32[3, 24]\ny = cat([a, b], dim=1)\noutput y\n"},
    {"", "input x: f32[40, 50]\ny = exp(x) * 2\noutput y\n"},
    {"", "input x: f32[40, 50]\ny = sum(pad(x, [1, 1]), dim=1)\noutput y\n"},
    /* a spatial pyramid pool's 9-wide window over rows of 13: every part
     * would be shorter than a vector (1 to 5), so no split */
    {"", "input x: f32[2, 16, 13, 13]\ny = max_pool2d(x, 9, stride=1, padding=4)\noutput y\n"},
    /* ... but parts that drop a sigmoid pay even when short (a detection
     * head's rows of 6: 4 coordinates, then 2 scores) */
    {"x1 split at 1 point",
     "input a: f32[300, 4]\ninput b: f32[300, 2]\ny = cat([a, sigmoid(b)], dim=1)\noutput y\n"},
};

TEST(codegen_inner_loop_split) {
    for (size_t i = 0; i < sizeof inner_progs / sizeof *inner_progs; i++) {
        CgOutput out;
        Plan *p = generate_program("inner", inner_progs[i][1], &out);
        if (!p) continue;
        const char *want = inner_progs[i][0];
        bool split = strstr(out.source, "the inner loop's guards") != NULL;
        EXPECT(*want ? strstr(out.source, want) != NULL : !split, "program %zu: want '%s'", i,
               want);
        EXPECT(i > 1 || strstr(out.source, CG_SHORT_MARK), "program %zu: no short part marked", i);
        cg_free(&out);
        plan_free(p);
    }
}

TEST(codegen_outer_loop_split) {
    for (size_t i = 0; i < sizeof split_progs / sizeof *split_progs; i++) {
        CgOutput out;
        Plan *p = generate_program("split", split_progs[i][1], &out);
        if (!p) continue;
        const char *want = split_progs[i][0];
        char pat[64];
        snprintf(pat, sizeof pat, "x0 in %s ranges", want);
        bool split = strstr(out.source, "ranges: the guards") != NULL;
        EXPECT(!strcmp(want, "0") ? !split : strstr(out.source, pat) != NULL,
               "program %zu: want %s ranges", i, want);
        cg_free(&out);
        plan_free(p);
    }
    /* 45 inputs of one row each (in cats of at most 8, .kiln's list
     * limit): 45 ranges */
    char src[4096];
    int at = 0;
    for (int k = 0; k < 45; k++)
        at += snprintf(src + at, sizeof src - (size_t)at, "input i%d: f32[1, 32]\n", k);
    at += snprintf(src + at, sizeof src - (size_t)at, "y = cat([");
    for (int k = 0; k < 45; k++)
        at += snprintf(src + at, sizeof src - (size_t)at, "%s%si%d%s", k && k % 8 == 0 ? ", " : "",
                       k % 8 == 0 ? "cat([" : ", ", k, k % 8 == 7 || k == 44 ? "], dim=0)" : "");
    snprintf(src + at, sizeof src - (size_t)at, "], dim=0) * 2\noutput y\n");
    CgOutput out;
    Plan *p = generate_program("split45", src, &out);
    if (p) {
        EXPECT(strstr(out.source, "x0 in 45 ranges") != NULL, "45 inputs: not 45 ranges");
        cg_free(&out);
        plan_free(p);
    }
}

/* ARM is left open: the generated C of the examples (vecmath.h included,
 * no x86 builtin outside its #if) compiles for AArch64 and its inner loops
 * vectorize with NEON, when Debian's gcc-aarch64-linux-gnu is installed. */
TEST(codegen_vectorized_arm64_cross) {
    static const char *examples[] = {"chain",      "rowsum",    "siblings", "wall",       "softmax",
                                     "layernorm",  "gelu_bias", "dropout",  "wall_chain", "layout",
                                     "long_chain", "unrelated", "residual"};
    if (system("command -v aarch64-linux-gnu-gcc > /dev/null 2>&1") != 0) {
        printf("codegen: arm64 cross-compile skipped: no aarch64-linux-gnu-gcc "
               "(apt-get install gcc-aarch64-linux-gnu)\n");
        return;
    }
    test_cc_override = "aarch64-linux-gnu-gcc";
    int total = 0, missed_all = 0;
    for (size_t i = 0; i < sizeof examples / sizeof *examples; i++) {
        CgOutput out;
        Plan *p = generate_program(examples[i], NULL, &out);
        if (!p) continue;
        int missed = 0,
            marks = check_vectorized(examples[i], "-march=armv8.2-a", out.source, &missed);
        EXPECT(marks > 0, "%s: no inner loops or the arm64 compile failed", examples[i]);
        total += marks > 0 ? marks : 0;
        missed_all += missed;
        cg_free(&out);
        plan_free(p);
    }
    test_cc_override = NULL;
    printf("codegen: arm64 (-march=armv8.2-a): %d of %d inner loops vectorized\n",
           total - missed_all, total);
    EXPECT(missed_all == 0, "%d of %d inner loops not vectorized for arm64", missed_all, total);
}

/* GCC 12 tuned for Skylake-SP or Rocket Lake prefers 256-bit vectors and
 * then vectorizes no loop that calls an AVX-512 SIMD clone ("no vectype
 * for stmt"); tuned for AMD Zen 1 (znver1) or the Bulldozer family it
 * prefers 128-bit ones and does the same to the AVX2 clones: kernels fell
 * to scalar code (docs/decisions.md: Target tiers instead of
 * -march=native; chain took 67.9 ms instead of 2.1 ms on a Zen 1). Each
 * tier's own flags (tgt_make's, -mtune=native replaced by the tuning)
 * must keep them vectorized under those tunings (the tuning is only a
 * compile flag: checked on any CPU). Without the width flag the loop is
 * not vectorized with GCC 12; that is printed, not asserted (a later GCC
 * may fix it). */
TEST(codegen_vectorized_under_narrow_tunings) {
    static const struct {
        int tier;
        const char *tune;
    } cases[] = {{TGT_V4, "skylake-avx512"}, {TGT_V4, "rocketlake"}, {TGT_V4, "icelake-server"},
                 {TGT_V3, "znver1"},         {TGT_V3, "bdver4"},     {TGT_V3, "btver2"}};
    char *text = read_example("chain");
    CHECKF(text, "no program chain");
    Plan *p = plan_of(text, NULL);
    free(text);
    CHECKF(p, "chain does not plan");
    CgOutput out;
    char err[512], flags[300], bare[300];
    CHECKF(cg_generate(p->sched, &out, err, sizeof err) == KILN_OK, "%s", err);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *tier = test_tier_flags(cases[i].tier), *at = strstr(tier, "-mtune=native");
        EXPECT(at && strstr(tier, "-mprefer-vector-width="), "tier %s: flags '%s'",
               tgt_name((TargetTier)cases[i].tier), tier);
        if (!at) continue;
        snprintf(flags, sizeof flags, "%.*s-mtune=%s%s", (int)(at - tier), tier, cases[i].tune,
                 at + strlen("-mtune=native"));
        int missed = 0, marks = check_vectorized("chain_tuned", flags, out.source, &missed);
        EXPECT(marks > 0 && missed == 0, "chain under %s: %d of %d loops not vectorized", flags,
               missed, marks);
        snprintf(bare, sizeof bare, "%.*s-mtune=%s", (int)(at - tier), tier, cases[i].tune);
        vec_quiet = true;
        marks = check_vectorized("chain_tuned_bare", bare, out.source, &missed);
        vec_quiet = false;
        printf("codegen: chain under %s: %d of %d inner loops not vectorized\n", bare, missed,
               marks);
    }
    cg_free(&out);
    plan_free(p);
}

/* ===== memory planning ============================================================= */

/* Each t_i is materialized (two users, one of them an expensive sin) and
 * lives from its kernel to the next: t1 and t3 can share memory. */
static const char *chain_prog = "input x: f32[64, 100]\n"
                                "t1 = sin(x + mean(x))\n"
                                "t2 = sin(t1 + mean(t1))\n"
                                "t3 = sin(t2 + mean(t2))\n"
                                "t4 = sin(t3 + mean(t3))\n"
                                "t5 = sin(t4 + mean(t4))\n"
                                "y = t5 + mean(t5)\n"
                                "output y\n";

/* No two arena buffers that are live at the same call overlap. */
static int plan_is_sound(const RtProgram *p) {
    const CgOutput *code = rt_code(p);
    const LoopProgram *lp = rt_schedule(p)->prog;
    int n = lp->nbufs, ok = 1;
    int *first = malloc(sizeof(int) * (size_t)n), *last = malloc(sizeof(int) * (size_t)n);
    for (int b = 0; b < n; b++) first[b] = last[b] = -1;
    for (int c = 0; c < code->ncalls; c++)
        for (int i = 0; i < code->calls[c].nbufs; i++) {
            int b = code->calls[c].bufs[i];
            if (first[b] < 0) first[b] = c;
            last[b] = c;
        }
    for (int a = 0; a < n; a++)
        for (int b = a + 1; b < n; b++) {
            int64_t oa = rt_buffer_offset(p, a), ob = rt_buffer_offset(p, b);
            if (oa < 0 || ob < 0 || first[a] > last[b] || first[b] > last[a]) continue;
            int64_t sa = lp->bufs[a]->numel * 4, sb = lp->bufs[b]->numel * 4;
            if (oa < ob + sb && ob < oa + sa) {
                printf("  %s and %s overlap while both live\n", lp->bufs[a]->name,
                       lp->bufs[b]->name);
                ok = 0;
            }
            if (oa % 64 || ob % 64) ok = 0;
        }
    free(first);
    free(last);
    return ok;
}

TEST(codegen_memory_reuse) {
    kiln_graph *g = kiln_graph_new();
    CHECK(kiln_parse(g, chain_prog, "chain") == KILN_OK);
    kiln_program *prog = NULL;
    kiln_status st = test_compile_in_cache(g, "codegen-cache", NULL, &prog);
    CHECKF(st == KILN_OK, "%s", kiln_error(g));
    RtProgram *p = kiln_program_rt(prog);
    const RtStats *s = rt_stats(p);
    int in_arena = 0;
    for (int b = 0; b < rt_schedule(p)->prog->nbufs; b++) in_arena += rt_buffer_offset(p, b) >= 0;
    EXPECT(in_arena >= 5, "only %d buffers in the arena", in_arena);
    EXPECT(s->arena_bytes < s->intermediate_bytes, "arena %lld bytes, intermediates %lld: no reuse",
           (long long)s->arena_bytes, (long long)s->intermediate_bytes);
    EXPECT(s->arena_bytes <= 2 * 64 * 100 * 4 + 6 * 64, "arena %lld bytes",
           (long long)s->arena_bytes);
    EXPECT(s->peak_bytes == s->io_bytes + s->arena_bytes, "peak = io + arena");
    EXPECT(s->io_bytes == 2 * 64 * 100 * 4, "io %lld", (long long)s->io_bytes);
    EXPECT(plan_is_sound(p), "overlapping live buffers");
    /* and the shared memory gives the interpreter's answer */
    float *x = malloc(sizeof(float) * 6400);
    kiln_fill_randn(x, 6400, 11);
    kiln_tensor in = {KILN_F32, 2, {64, 100}, x}, got, want;
    CHECK(kiln_program_run(prog, &in, &got) == KILN_OK);
    CHECK(kiln_interpret(g, &in, &want) == KILN_OK);
    RtTolerance tol = rt_tolerance(rt_graph(p));
    double worst = 0;
    for (int i = 0; i < 6400; i++) {
        double e = rt_excess(((float *)got.data)[i], ((float *)want.data)[i], tol);
        if (!(e <= worst)) worst = e;
    }
    EXPECT(worst <= 1.0, "fused differs: %g x tolerance", worst);
    kiln_tensor_free(&got);
    kiln_tensor_free(&want);
    free(x);
    kiln_program_free(prog);
    kiln_graph_free(g);
}

/* Row prefetch only where later passes re-read the row from L1 and the rows
 * are past the L2 (CG_ROW_PF_MIN), not in a
 * one-pass row reduction, nor for a value the same in every row. */
TEST(codegen_row_prefetch_only_for_several_passes) {
    char *fn = kernel0_text("input x: f32[300, 1000]\ns = sum(relu(x + 1), dim=1)\noutput s\n");
    CHECK(fn);
    EXPECT(!strstr(fn, "kiln_prefetch("), "one pass:\n%s", fn);
    free(fn);
    fn = kernel0_text(
        "input x: f32[600, 1000]\ninput g: f32[1000]\ny = layer_norm(x * g, [1000])\noutput y\n");
    CHECK(fn);
    EXPECT(count(fn, "kiln_prefetch(") == 1 &&
               strstr(fn, "kiln_prefetch(&in_x[1000*(x0 + 1) + (r0b)], "),
           "x of the next row, not g:\n%s", fn);
    free(fn);
    /* a second pass no longer than a block asks for the whole row at once;
     * so does one that stores (it streams whole rows: test below) */
    fn = kernel0_text("input x: f32[3000, 200]\ny = layer_norm(x, [200])\noutput y\n");
    CHECK(fn);
    EXPECT(count(fn, "kiln_prefetch(&in_x[200*(x0 + 1) + (0)], 200);") == 1 && !strstr(fn, "r0b"),
           "short rows:\n%s", fn);
    free(fn);
    /* rows of 1 MB in all (under CG_ROW_PF_MIN) are in the L2: no prefetch,
     * one pass over each row (an OCR head's softmax over 6625 classes) */
    fn = kernel0_text("input x: f32[40, 6625]\ny = softmax(x, dim=1)\noutput y\n");
    CHECK(fn);
    EXPECT(!strstr(fn, "kiln_prefetch(") && !strstr(fn, "r0b"), "rows in the L2:\n%s", fn);
    free(fn);
    fn = kernel0_text("input x: f32[600, 1000]\ny = x - mean(x, dim=1, keepdim=true)\noutput y\n");
    CHECK(fn);
    EXPECT(count(fn, "kiln_prefetch(&in_x[1000*(x0 + 1) + (0)], 1000);") == 1 && !strstr(fn, "r0b"),
           "a stored second pass:\n%s", fn);
    free(fn);
}

/* Streamed stores: an output of at least 16 MiB (CG_STREAM_MIN) is written
 * through a per-thread tile and kiln_stream (non-temporal stores) after the
 * loop that fills it; a smaller one stores as usual. Row kernels stream
 * whole rows; a long flat pointwise loop runs in blocks of 2048, one with
 * expensive math (sin, gelu) in blocks of 128, each of which first asks
 * for its large inputs 1024 elements ahead (kiln_prefetch_ahead; not the
 * small bias b). test_fused.c checks the values. */
TEST(codegen_streamed_stores) {
    static const struct {
        const char *src;
        const char *tile;   /* the tile's store in the inner loop, or NULL: none */
        const char *stream; /* the copy after the loop */
    } cases[] = {
        {"input x: f32[2049, 2049]\ny = relu(x + 1)\noutput y\n", "st_buf0[x0 - x0b] = ",
         "kiln_stream(&buf0[(x0b)], st_buf0, (x0b + 2048 < 4198401 ? x0b + 2048 : 4198401) - x0b);"},
        {"input x: f32[1025, 4099]\ny = softmax(x, dim=1)\noutput y\n",
         "st_buf3[r0] = ", "kiln_stream(&buf3[4099*x0 + (0)], st_buf3, 4099);"},
        {"input x: f32[257, 16411]\ninput b: f32[16411]\ny = x * b\noutput y\n",
         "st_buf0[x1 - x1b] = ",
         "kiln_stream(&buf0[16411*x0 + (x1b)], st_buf0, (x1b + 2048 < 16411 ? x1b + 2048 : 16411) - x1b);"},
        {"input x: f32[1100, 4096]\nm = amax(x, dim=1, keepdim=true)\ne = exp(x - m)\n"
         "s = sum(e, dim=1, keepdim=true)\ny = e / s\noutput e, y\n",
         "st_buf1[r0] = ", "kiln_stream(&buf1[4096*x0 + (0)], st_buf1, 4096);"},
        {"input x: f32[2048, 2047]\ny = relu(x + 1)\noutput y\n", NULL, NULL}, /* 16 MiB - 8 KiB */
        /* expensive math: tiles of 128, also where a row would fit whole */
        {"input x: f32[2049, 2049]\ny = sin(x)\noutput y\n", "st_buf0[x0 - x0b] = ",
         "kiln_stream(&buf0[(x0b)], st_buf0, (x0b + 128 < 4198401 ? x0b + 128 : 4198401) - x0b);"},
        {"input x: f32[2049, 4096]\ninput b: f32[4096]\ny = gelu(x + b)\noutput y\n",
         "st_buf0[x1 - x1b] = ",
         "kiln_stream(&buf0[4096*x0 + (x1b)], st_buf0, (x1b + 128 < 4096 ? x1b + 128 : 4096) - x1b);"},
    };
    static const char *const ahead[] = {
        [5] = "            kiln_prefetch_ahead(in_x, (x0b + 1024), 128, 4198401);\n"
              "            #pragma omp simd\n",
        [6] = "                kiln_prefetch_ahead(in_x, 4096*x0 + (x1b + 1024), 128, 8392704);\n"
              "                #pragma omp simd\n",
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *fn = kernel0_text(cases[i].src);
        CHECK(fn);
        if (cases[i].tile) {
            EXPECT(count(fn, cases[i].tile) == 1 && count(fn, cases[i].stream) == 1 &&
                       count(fn, "kiln_stream(") == 1,
                   "case %zu streams:\n%s", i, fn);
            /* e is read again by y's stage: from its tile, not from memory;
             * e's stage also sums, so e goes out after its loop, while y's
             * stage streams each vector as it is computed (4096 columns) */
            if (i == 3) {
                EXPECT(count(fn, "= st_buf1[r0];") == 1 && !strstr(fn, "= buf1["),
                       "e read again:\n%s", fn);
                EXPECT(count(fn, "for (int64_t r0v = 0; r0v < 4096; r0v += 16) {") == 1 &&
                           count(fn, "kiln_stream16(&buf3[4096*x0 + (r0v)], &st_buf3[r0v]);") ==
                               1 &&
                           count(fn, "for (int64_t r0 = r0v; r0 < r0v + 16; r0++) {") == 1,
                       "y per vector:\n%s", fn);
            }
            /* the copy follows the loop that fills the tile; the fence comes
             * once per thread, after the row loop, not after each row's copy
             * (docs/decisions.md: Streamed stores) */
            const char *t = strstr(fn, cases[i].tile), *s = strstr(fn, cases[i].stream);
            EXPECT(t && s && t < s, "case %zu: copy before the tile is full:\n%s", i, fn);
            const char *f = strstr(fn, "        }\n        kiln_stream_fence();\n");
            EXPECT(count(fn, "kiln_stream_fence()") == 1 && f && s < f,
                   "case %zu: one fence, after the row loop:\n%s", i, fn);
        } else {
            EXPECT(!strstr(fn, "kiln_stream") && !strstr(fn, "st_buf"),
                   "case %zu does not stream:\n%s", i, fn);
        }
        EXPECT(i < 5 ? !strstr(fn, "kiln_prefetch_ahead")
                     : count(fn, "kiln_prefetch_ahead") == 1 && strstr(fn, ahead[i]),
               "case %zu: prefetch ahead:\n%s", i, fn);
        free(fn);
    }
}

/* Inference batch norm is a scale and a shift per channel (decompose.c, as
 * PyTorch's CPU kernel computes it): the per-channel rsqrt, scale and shift
 * sit outside the inner loop, which multiplies and adds once per element. */
TEST(codegen_batch_norm_scale_shift) {
    char *fn = kernel0_text("input x: f32[2, 8, 50, 50]\ninput m: f32[8]\ninput v: f32[8]\n"
                            "input g: f32[8]\ninput b: f32[8]\n"
                            "y = batch_norm(x, m, abs(v) + 1.0, g, b)\noutput y\n");
    CHECK(fn);
    const char *in = strstr(fn, CG_INNER_MARK);
    EXPECT(in && strstr(fn, "sqrtf(") && strstr(fn, "sqrtf(") < in, "rsqrt per channel:\n%s", fn);
    EXPECT(in && count(in, " * tmp") == 1 && count(in, " + tmp") == 1 && count(in, " - tmp") == 0 &&
               !strstr(in, "sqrtf("),
           "one multiply and one add per element:\n%s", fn);
    free(fn);
}
