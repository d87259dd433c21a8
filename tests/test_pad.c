/*
 * test_pad.c -- pad, concat, pooling and negative-step slices (the ops the
 * ONNX importer needed beyond the first language).
 *
 * The values of every mode are checked against NumPy by the golden cases
 * (tests/golden/gen.py: pad_*, cat_*, slice_negative_step, max_pool_*,
 * avg_pool), which test_fused.c also runs fused. Here: the same ops at
 * sizes where the generated kernels vectorize and run in parallel, fused
 * against the reference interpreter; how they fuse (kernel counts, what the
 * inliner does with a pool's window); the select simplifier; whether the
 * guarded inner loops vectorize; and the builders' error messages.
 */
#include "test.h"
#include "runtime/runtime.h"
#include "sched/sched.h"
#include "testutil.h"

/* ===== helpers ============================================================ */

static kiln_graph *parse(const char *src) {
    kiln_graph *g = kiln_graph_new();
    if (kiln_parse(g, src, "pad") != KILN_OK) {
        test_failf(__FILE__, __LINE__, "parse: %s", kiln_error(g));
        kiln_graph_free(g);
        return NULL;
    }
    return g;
}

static Plan *plan_of(const char *src) {
    kiln_graph *g = parse(src);
    if (!g) return NULL;
    KilnConfig cfg = kiln_config_default();
    cfg.logs = 0;
    Plan *p = NULL;
    char err[512];
    if (plan_build(g, &cfg, &p, err, sizeof err) != KILN_OK) {
        test_failf(__FILE__, __LINE__, "plan: %s", err);
        p = NULL;
    }
    kiln_graph_free(g);
    return p;
}

/* The loop IR's buffer expressions as text. */
static char *loop_ir_text(const Plan *p) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    lower_print(f, p->prog);
    fclose(f);
    return buf;
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *q = hay; (q = strstr(q, needle)); q += strlen(needle)) n++;
    return n;
}

/* Compile and interpret src on the same random inputs; every output must
 * agree within 1e-5 + 1e-4 |want| (pad, concat and max are exact; an
 * average adds its taps in the same order both ways). */
static int fused_matches(const char *src) {
    kiln_graph *g = parse(src);
    if (!g) return 0;
    int nin = kiln_num_inputs(g), nout = kiln_num_outputs(g), ok = 1;
    kiln_tensor in[8], got[8], want[8];
    for (int i = 0; i < nin; i++) {
        in[i] = kiln_input_desc(g, i);
        kiln_tensor_alloc(&in[i]);
        kiln_fill_randn(in[i].data, kiln_tensor_numel(&in[i]), 7 + (uint64_t)i);
    }
    kiln_program *p = NULL;
    if (kiln_compile(g, 0, &p) != KILN_OK || kiln_program_run(p, in, got) != KILN_OK ||
        kiln_interpret(g, in, want) != KILN_OK) {
        printf("  %s\n", p ? kiln_program_error(p) : kiln_error(g));
        ok = 0;
        nout = 0;
    }
    for (int i = 0; i < nout; i++) {
        const float *a = got[i].data, *b = want[i].data;
        for (int64_t k = 0; k < kiln_tensor_numel(&want[i]); k++)
            if (!(fabsf(a[k] - b[k]) <= 1e-5f + 1e-4f * fabsf(b[k]))) {
                printf("  output %s[%lld]: fused %.9g, interpreter %.9g\n", kiln_output_name(g, i),
                       (long long)k, a[k], b[k]);
                ok = 0;
                break;
            }
        kiln_tensor_free(&got[i]);
        kiln_tensor_free(&want[i]);
    }
    for (int i = 0; i < nin; i++) kiln_tensor_free(&in[i]);
    kiln_program_free(p);
    kiln_graph_free(g);
    return ok;
}

/* ===== fused against the interpreter ======================================== */

TEST(pad_fused_large) {
    CHECK(fused_matches("input x: f32[2, 8, 33, 70]\n"
                        "a = pad(relu(x) + 1.0, [3, 2, 1, 4], value=0.25)\n"
                        "b = pad(x, [2, 5, 3, 1], mode=\"reflect\") * 2.0\n"
                        "c = pad(sigmoid(x), [1, 2, 2, 1], mode=\"replicate\")\n"
                        "d = pad(x, [-3, 4, 2, -5], value=-1.0)\n"
                        "output a, b, c, d\n"));
}

TEST(concat_fused_large) {
    CHECK(fused_matches("input a: f32[4, 3, 100]\ninput b: f32[4, 5, 100]\n"
                        "input c: f32[4, 3, 37]\n"
                        "x = cat([a * 2.0, relu(b), a + 1.0], dim=1)\n"
                        "y = cat([a, c, exp(c), a, a, c], dim=2) - 1.0\n"
                        "z = sum(cat([b, a], dim=1), dim=1)\n"
                        "output x, y, z\n"));
}

TEST(pool_fused_large) {
    CHECK(fused_matches("input x: f32[2, 8, 40, 50]\ninput v: f32[2, 4, 9, 10, 11]\n"
                        "a = max_pool2d(relu(x), 3, stride=1, padding=1)\n"
                        "b = max_pool2d(x, [3, 2], stride=2, padding=1, dilation=[2, 1], "
                        "ceil_mode=true)\n"
                        "c = avg_pool2d(relu(x) * 3.0, 3, stride=2, padding=1, ceil_mode=true, "
                        "count_include_pad=false)\n"
                        "d = avg_pool3d(v, 3, stride=2, padding=1)\n"
                        "e = max_pool3d(relu(v), 3, stride=1, padding=1)\n"
                        "f = max_pool1d(reshape(x, [2, 8, 2000]), 5, stride=3, padding=2)\n"
                        "output a, b, c, d, e, f\n"));
}

TEST(slice_negative_step_fused) {
    CHECK(fused_matches("input x: f32[64, 96]\ninput w: f32[96, 48]\n"
                        "a = slice(x, 1, 90, 3, step=-3) + 1.0\n"
                        "r = slice(x, 0, -1, -1000, step=-1)\n"
                        "b = matmul(r, slice(w, 1, -1, -1000, step=-1))\n"
                        "c = sum(slice(relu(x), 1, -2, -1000, step=-2), dim=1)\n"
                        "output a, b, c\n"));
}

/* ===== fusion ================================================================== */

/* max_pool(relu(x)): the window's taps count as one user of relu (NF_TAP),
 * so relu is inlined into the pool's single kernel, recomputed per tap;
 * so with a stride along the last dim when nothing is padded. */
TEST(pool_after_relu_is_one_kernel) {
    Plan *p = plan_of("input x: f32[2, 8, 32, 32]\n"
                      "y = max_pool2d(relu(x), 3, stride=1, padding=1)\n"
                      "z = avg_pool2d(relu(x + 1.0), 3, stride=2)\n"
                      "output y, z\n");
    CHECK(p);
    EXPECT(p->sched->nkernels == 2, "%d kernels, want one per pool", p->sched->nkernels);
    EXPECT(p->prog->ncomputed == 2, "%d buffers: relu was materialized", p->prog->ncomputed);
    char *ir = loop_ir_text(p);
    EXPECT(ir && count(ir, "relu(") == 18, "relu read once per tap (9 + 9):\n%s", ir);
    free(ir);
    plan_free(p);
}

/* A padded window strided along the last dim (ResNet's max pool 3x3/2,
 * padding 1) reads a materialized padded input (decompose.c: strided
 * border-tested loads do not vectorize): relu fuses into the pad kernel,
 * the window reads the padded buffer with no select; a stride along
 * another dim only keeps the single kernel. */
TEST(pool_strided_padded_reads_a_materialized_pad) {
    Plan *p = plan_of("input x: f32[2, 8, 32, 32]\n"
                      "y = max_pool2d(relu(x), 3, stride=2, padding=1)\n"
                      "z = avg_pool2d(relu(x + 1.0), 3, stride=2, padding=1)\n"
                      "output y, z\n");
    CHECK(p);
    char *ir = loop_ir_text(p);
    EXPECT(p->sched->nkernels == 4 && p->prog->ncomputed == 4 && ir && count(ir, "relu(") == 2 &&
               count(ir, "select(") == 4,
           "%d kernels, %d buffers, want a pad and a window kernel per pool:\n%s",
           p->sched->nkernels, p->prog->ncomputed, ir);
    free(ir);
    plan_free(p);
    p = plan_of("input x: f32[2, 8, 32, 32]\n"
                "y = max_pool2d(relu(x), [3, 3], stride=[2, 1], padding=1)\noutput y\n");
    CHECK(p);
    EXPECT(p->sched->nkernels == 1, "stride along rows only: %d kernels", p->sched->nkernels);
    plan_free(p);
}

/* A 3-D window reads a materialized padded input (decompose.c: GCC does not
 * vectorize its triple border tests): relu fuses into the pad kernel, the
 * window reads the padded buffer with no select. A 3x3x3 window is also
 * separable (27 taps, 3 + 9 when split): the maxima along the last dim
 * are a kernel of their own, read by the 3x3 over the other two. */
TEST(pool_3d_reads_a_materialized_pad) {
    Plan *p = plan_of("input v: f32[2, 4, 8, 8, 16]\n"
                      "y = max_pool3d(relu(v), 3, stride=1, padding=1)\noutput y\n");
    CHECK(p);
    char *ir = loop_ir_text(p);
    EXPECT(p->sched->nkernels == 3 && ir && count(ir, "select(") == 3 && count(ir, "relu(") == 1 &&
               count(ir, "maximum(") == 2 + 8,
           "%d kernels:\n%s", p->sched->nkernels, ir);
    free(ir);
    plan_free(p);
}

/* A big window is separable (decompose.c): a 13x13 max pool is the 13-tap
 * maximum along the last dim, materialized, then 13 taps along the other:
 * 24 maxima in two kernels, not 168 in one; a 3x3 window stays one kernel
 * of 8. The window's kernel computes 12 maxima per element, so a plane of
 * 128 x 13 x 13 (21,632 outputs, below CG_PARALLEL_MIN) still runs on
 * threads (codegen's work factor). */
TEST(pool_big_window_is_separable) {
    Plan *p = plan_of("input x: f32[1, 128, 13, 13]\n"
                      "y = max_pool2d(x, 13, stride=1, padding=6)\n"
                      "z = max_pool2d(x, 3, stride=1, padding=1)\noutput y, z\n");
    CHECK(p);
    char *ir = loop_ir_text(p);
    EXPECT(p->sched->nkernels == 3 && ir && count(ir, "maximum(") == 24 + 8, "%d kernels:\n%s",
           p->sched->nkernels, ir);
    free(ir);
    CgOutput out;
    char err[256];
    CHECKF(cg_generate(p->sched, &out, err, sizeof err) == KILN_OK, "%s", err);
    int parallel = 0;
    for (int k = 0; k < out.ncalls; k++) parallel += out.calls[k].parallel;
    EXPECT(parallel == 3, "%d of %d calls parallel", parallel, out.ncalls);
    cg_free(&out);
    plan_free(p);
}

/* Without the tap rule relu would have 9 users and be materialized (the
 * materialization the rule avoids): a relu read by 5 slices that are not a
 * pool's window is. */
TEST(pool_tap_rule_is_specific) {
    Plan *p = plan_of("input x: f32[8, 64]\nr = relu(x)\n"
                      "y = slice(r, 1, 0, 60) + slice(r, 1, 1, 61) + slice(r, 1, 2, 62) + "
                      "slice(r, 1, 3, 63) + slice(r, 1, 4, 64)\n"
                      "output y\n");
    CHECK(p);
    EXPECT(p->prog->ncomputed == 2, "relu with 5 users should be materialized: %d buffers",
           p->prog->ncomputed);
    plan_free(p);
}

TEST(concat_after_pointwise_is_one_kernel) {
    Plan *p = plan_of("input a: f32[16, 3, 64]\ninput b: f32[16, 5, 64]\n"
                      "y = cat([relu(a), b * 2.0, a + 1.0, sigmoid(b)], dim=1) + 3.0\n"
                      "output y\n");
    CHECK(p);
    EXPECT(p->sched->nkernels == 1 && p->prog->ncomputed == 1, "%d kernels, %d buffers",
           p->sched->nkernels, p->prog->ncomputed);
    plan_free(p);
}

TEST(pad_after_pointwise_is_one_kernel) {
    Plan *p = plan_of("input x: f32[16, 30, 30]\n"
                      "y = pad(relu(x) * 2.0, [1, 1, 1, 1]) + 1.0\n"
                      "z = pad(x, [2, 2, 2, 2], mode=\"reflect\") - 1.0\n"
                      "output y, z\n");
    CHECK(p);
    EXPECT(p->sched->nkernels == 2 && p->prog->ncomputed == 2, "%d kernels, %d buffers",
           p->sched->nkernels, p->prog->ncomputed);
    plan_free(p);
}

/* A pad or concat of a materialized value reads it at shifted indices: the
 * scheduler must not fuse the producer into that loop ("memory deps did
 * not match"), and the result must still be right. */
TEST(shifted_reads_are_not_fused) {
    static const char *src = "input x: f32[64, 300]\nr = exp(x)\n"
                             "p = slice(pad(r, [1, 1]), 1, 0, 300)\n"
                             "q = slice(cat([r, r], dim=1), 1, 7, 307)\n"
                             "y = p + r + q\noutput y\n";
    Plan *p = plan_of(src);
    CHECK(p);
    EXPECT(p->sched->nkernels == 2, "%d kernels", p->sched->nkernels);
    EXPECT(sched_why_not(p->sched, "op0", "op1") &&
               strstr(sched_why_not(p->sched, "op0", "op1"), "memory deps did not match"),
           "op0/op1: %s", sched_why_not(p->sched, "op0", "op1"));
    plan_free(p);
    CHECK(fused_matches(src));
}

/* ===== the select simplifier ===================================================== */

/* A slice of a pad that reads only the interior is x itself: every
 * predicate is decided by the slice's range and folds away. A slice of a
 * concat that reads only its second part reads only b. */
TEST(select_folds_decided_predicates) {
    Plan *p = plan_of("input x: f32[6, 9]\ninput a: f32[6, 4]\ninput b: f32[6, 5]\n"
                      "y = slice(slice(pad(x, [2, 3, 1, 1], value=7.0), 1, 2, 11), 0, 1, 7) + 1.0\n"
                      "z = slice(cat([a, b], dim=1), 1, 4, 9) * 2.0\n"
                      "w = slice(pad(x, [1, 1]), 1, 0, 5) + 1.0\n"
                      "output y, z, w\n");
    CHECK(p);
    char *ir = loop_ir_text(p);
    CHECK(ir);
    EXPECT(strstr(ir, "Pointwise([6, 9], load(x, 9*v0 + v1) + 1.0)"), "pad folded:\n%s", ir);
    EXPECT(strstr(ir, "Pointwise([6, 5], load(b, 5*v0 + v1) * 2.0)"), "concat folded:\n%s", ir);
    EXPECT(strstr(ir, "select(0 <= v1 - 1, load(x, 9*v0 + v1 - 1), 0.0)"),
           "only the lower bound is tested:\n%s", ir);
    EXPECT(count(ir, "select(") == 1, "one select left:\n%s", ir);
    free(ir);
    plan_free(p);
}

/* ===== generated code ============================================================ */

/* The guarded loads of a pad, a concat and a pool's window keep their inner
 * loops vectorized (masked loads), as GCC's report says, also when a
 * vecmath select (relu, maximum) reads a guarded load (with the JIT's
 * -fno-trapping-math; without it GCC 12 leaves pad(relu(x)) scalar). */
TEST(pad_concat_inner_loops_vectorize) {
    Plan *p = plan_of("input x: f32[64, 200]\ninput a: f32[64, 100]\n"
                      "input v: f32[4, 8, 30, 32]\n"
                      "y = pad(relu(x), [3, 5], value=1.0) * 2.0\n"
                      "z = cat([a, x, a * 2.0], dim=1)\n"
                      "m = max_pool1d(reshape(x, [8, 8, 200]), 3, stride=1, padding=1)\n"
                      "n = max_pool2d(relu(v), 3, stride=1, padding=1)\n"
                      "output y, z, m, n\n");
    CHECK(p);
    CgOutput out;
    char err[512], c[600], o[600];
    CHECKF(cg_generate(p->sched, &out, err, sizeof err) == KILN_OK, "%s", err);
    EXPECT(strstr(out.source, " ? "), "selects become C conditionals");
    char *report = NULL;
    if (test_compile_report("vec_pad", out.source, c, o, &report) == 0) {
        /* GCC reports a loop with selects at one of its body's lines: accept
         * any line up to the next inner loop (a split loop's short parts,
         * CG_SHORT_MARK, end the range but need not vectorize) */
        int line = 1, marks = 0, missed = 0, at[32];
        bool shrt[32];
        for (const char *q = out.source; *q && marks < 32; q++) {
            if (*q == '\n') {
                line++;
            } else if (!strncmp(q, "/* inner loop", 13)) {
                shrt[marks] = !strncmp(q, CG_SHORT_MARK, strlen(CG_SHORT_MARK));
                at[marks++] = line;
            }
        }
        int checked = 0;
        for (int m = 0; m < marks; m++) {
            if (shrt[m]) continue;
            int end = m + 1 < marks ? at[m + 1] - 2 : at[m] + 16, ok = 0;
            for (int l = at[m]; l <= end && !ok; l++) ok = test_vectorized_at(report, c, l, true);
            missed += !ok;
            checked++;
        }
        marks = checked;
        EXPECT(marks >= 4 && missed == 0, "%d of %d inner loops not vectorized (%s)", missed, marks,
               c);
    } else {
        test_failf(__FILE__, __LINE__, "generated C does not compile");
    }
    free(report);
    cg_free(&out);
    plan_free(p);
}

/* ===== errors ====================================================================== */

static void expect_error(kiln_value v, kiln_graph *g, const char *want) {
    EXPECT(v == KILN_NONE && strstr(kiln_error(g), want), "want '%s', got '%s'", want,
           kiln_error(g));
}

TEST(pad_concat_pool_errors) {
    static const int64_t s4[4] = {1, 2, 5, 5}, s3[3] = {1, 2, 5}, s2[3] = {1, 3, 5};
    static const int64_t b1[4] = {0, 0, 1, 1}, b5[4] = {0, 0, 5, 0}, bneg[4] = {0, 0, -5, 0};
    static const int64_t a0[4] = {0, 0, 0, 0}, a1[4] = {0, 0, 1, 0};
    static const int64_t e2[2] = {0, 3}, b1e[2] = {1, 0};
    struct {
        int what;
        const char *want;
    } cases[] = {
        {0, "pad: 3 pad widths given for a tensor of rank 4"},
        {1, "pad: reflect padding of 5 and 0 needs dim 2"},
        {2, "pad: cropping 5 of dim 2 (size 5) leaves nothing to repeat"},
        {3, "pad: unknown mode 7"},
        {4, "concat: part 1 is f32[1, 3, 5], part 0 is f32[1, 2, 5]: all dims but dim 0"},
        {5, "concat: needs at least one value"},
        {6, "max_pool: nspatial must be 1, 2 or 3, got 4"},
        {7, "avg_pool: a 1-D pool needs a tensor of rank 3"},
        {8, "max_pool: the window (extent 7) is larger than the padded input (6) in dim 2"},
        {9, "avg_pool: kernel, stride and dilation must be >= 1"},
        {10, "slice: step must not be 0"},
        {11, "pad: dim 0 is empty (size 0): there is nothing to reflect"},
        {12, "pad: widths -6, 0 of dim 2"},
        {13, "pad: a bool tensor pads with 0 or 1, got 0.5"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kiln_graph *g = kiln_graph_new();
        kiln_value x = kiln_input(g, "x", KILN_F32, 4, s4);
        kiln_value y = kiln_input(g, "y", KILN_F32, 3, s3), z = kiln_input(g, "z", KILN_F32, 3, s2);
        kiln_value parts[2] = {y, z}, v = 0;
        kiln_pool_params pp = {
            .nspatial = 2, .kernel = {3, 3}, .stride = {1, 1}, .dilation = {3, 1}};
        int64_t crop[4] = {0, 0, -6, 0};
        switch (cases[i].what) {
        case 0: v = kiln_pad(g, x, KILN_PAD_CONSTANT, 3, b1, b1, 0); break;
        case 1: v = kiln_pad(g, x, KILN_PAD_REFLECT, 4, b5, a0, 0); break;
        case 2: v = kiln_pad(g, x, KILN_PAD_EDGE, 4, bneg, a1, 0); break;
        case 3: v = kiln_pad(g, x, (kiln_pad_mode)7, 4, b1, b1, 0); break;
        case 4: v = kiln_concat(g, 2, parts, 1); break;
        case 5: v = kiln_concat(g, 0, parts, 0); break;
        case 6:
            pp.nspatial = 4;
            v = kiln_max_pool(g, x, &pp);
            break;
        case 7:
            pp.nspatial = 1;
            v = kiln_avg_pool(g, x, &pp);
            break;
        case 8:
            pp.pad_end[0] = 1;
            v = kiln_max_pool(g, x, &pp);
            break;
        case 9:
            pp.stride[1] = 0;
            v = kiln_avg_pool(g, x, &pp);
            break;
        case 10: v = kiln_slice(g, x, 3, 0, 5, 0); break;
        case 11: /* an empty dim has no edge to reflect */
            v = kiln_pad(g, kiln_input(g, "e", KILN_F32, 2, e2), KILN_PAD_REFLECT, 2, b1e, b1e, 0);
            break;
        case 12: v = kiln_pad(g, x, KILN_PAD_CONSTANT, 4, crop, a0, 0); break;
        case 13:
            v = kiln_pad(g, kiln_binary(g, "gt", x, kiln_scalar(g, 0)), KILN_PAD_CONSTANT, 4, b1,
                         a0, 0.5);
            break;
        }
        if (cases[i].what == 4) { /* dim 0 differs too: use dim 2 for the message */
            kiln_graph_free(g);
            g = kiln_graph_new();
            y = kiln_input(g, "y", KILN_F32, 3, s3);
            z = kiln_input(g, "z", KILN_F32, 3, s2);
            kiln_value q[2] = {y, z};
            v = kiln_concat(g, 2, q, 0);
        }
        expect_error(v, g, cases[i].want);
        kiln_graph_free(g);
    }
}

/* .kiln: the mode string, the pad list, cat's list of tensors. */
TEST(pad_concat_pool_parse_errors) {
    static const struct {
        const char *src, *want;
    } cases[] = {
        {"input x: f32[2, 3]\ny = pad(x, [1, 1], mode=\"wrap\")\noutput y\n",
         "pad: mode must be \"constant\", \"replicate\" or \"reflect\""},
        {"input x: f32[2, 3]\ny = pad(x, [1, 1, 1])\noutput y\n",
         "argument 'pad' of pad must hold pairs for at most 2 dims, got 3 values"},
        {"input x: f32[2, 3]\ny = cat([x, 1], dim=0)\noutput y\n",
         "list elements must be tensors, got an int"},
        {"input x: f32[2, 3]\ny = cat(x)\noutput y\n",
         "argument 'tensors' of cat must be a list of tensors, got a tensor"},
        {"input x: f32[1, 2, 8, 8]\ny = max_pool2d(x, [2, 2, 2])\noutput y\n",
         "argument 'kernel_size' of max_pool2d must be an int or a list of 2 ints"},
        {"input x: f32[1, 2, 8]\ny = avg_pool1d(x, 2, padding=[1, 2, 3])\noutput y\n",
         "argument 'padding' of avg_pool1d must be an int or a list of 1 ints"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kiln_graph *g = kiln_graph_new();
        EXPECT(kiln_parse(g, cases[i].src, "t.kiln") != KILN_OK &&
                   strstr(kiln_error(g), cases[i].want),
               "case %zu: want '%s', got '%s'", i, cases[i].want, kiln_error(g));
        kiln_graph_free(g);
    }
}
