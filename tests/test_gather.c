/*
 * test_gather.c -- gather (numpy.take) and conv_transpose2d, the externs
 * the ONNX importer needed (Gather, ConvTranspose): builder shapes and argument errors, the compiled path (strided
 * views as operands, OpenBLAS sgemm + col2im, the generated wrapper, fused
 * pointwise epilogues) against the reference interpreter, the run-time
 * error of an index out of range in both, and ext_gather's epilogue
 * contract (every output element handed to the epilogue exactly once, after
 * it is written). NumPy's answers for the same ops are the golden cases
 * gather_* and convt_* (tests/golden/gen.py, cross-checked there once
 * against torch's conv_transpose2d), run interpreted by golden_cases and
 * compiled by fused_golden_cases.
 *
 * Compiles share a fresh JIT cache under test_tmpdir(). Tolerance:
 * rt_tolerance of the program, as in test_extern_fused.c; a gather alone is
 * a copy and must match exactly.
 */
#include "test.h"
#include "externs/externs.h"
#include "runtime/runtime.h"
#include "testutil.h"

typedef TestProg Prog;

static kiln_value input(Prog *P, const char *name, int rank, const int64_t *shape) {
    return test_prog_input(P, name, rank, shape, 900);
}

/* An index input: integers in [lo, hi] drawn from a fixed LCG. */
static kiln_value indices(Prog *P, const char *name, int rank, const int64_t *shape, int lo,
                          int hi) {
    kiln_value v = input(P, name, rank, shape);
    if (v < 0) return v;
    kiln_tensor *t = &P->in[P->nin - 1];
    uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(P->nin + 1);
    for (int64_t k = 0; k < kiln_tensor_numel(t); k++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        ((float *)t->data)[k] = (float)(lo + (int)((s >> 33) % (uint64_t)(hi - lo + 1)));
    }
    return v;
}

static kiln_value weight(Prog *P, const char *name, int rank, const int64_t *shape, uint64_t seed) {
    return test_random_weight(P->g, name, rank, shape, seed);
}

static bool compile_and_compare(Prog *P, const kiln_options *o, const char *exact) {
    return test_prog_check(P, "gather-cache", o, exact);
}

/* The kernel that computes output `name`: its extern kind and member count. */
static const Kernel *kernel_of(Prog *P, const char *name) {
    const Schedule *s = rt_schedule(kiln_program_rt(P->p));
    const LoopProgram *lp = s->prog;
    int out = -1;
    for (int i = 0; i < kiln_num_outputs(P->g); i++)
        if (!strcmp(kiln_output_name(P->g, i), name)) out = lp->outputs[i];
    for (int k = 0; out >= 0 && k < s->nkernels; k++)
        for (int m = 0; m < s->kernels[k].n; m++)
            if (s->nodes[s->kernels[k].members[m]].buf == out) return &s->kernels[k];
    return NULL;
}

/* ===== builders ============================================================ */

static int64_t shape_of(kiln_graph *g, kiln_value v, int64_t *s) {
    int r = kiln_value_rank(g, v);
    memcpy(s, kiln_value_shape(g, v), sizeof(int64_t) * (size_t)(r > 0 ? r : 0));
    return r;
}

TEST(gather_builder_shapes) {
    kiln_graph *g = kiln_graph_new();
    kiln_value x = kiln_input(g, "x", KILN_F32, 3, (int64_t[]){2, 3, 4});
    kiln_value i0 = kiln_input(g, "i0", KILN_F32, 0, NULL);
    kiln_value i2 = kiln_input(g, "i2", KILN_F32, 2, (int64_t[]){5, 6});
    int64_t s[KILN_MAX_RANK];
    EXPECT(shape_of(g, kiln_gather(g, x, i2, 1), s) == 4 && s[0] == 2 && s[1] == 5 && s[2] == 6 &&
               s[3] == 4,
           "axis 1, 2-d indices");
    EXPECT(shape_of(g, kiln_gather(g, x, i0, -1), s) == 2 && s[0] == 2 && s[1] == 3,
           "axis -1, 0-d index");
    EXPECT(shape_of(g, kiln_gather(g, x, i2, 0), s) == 4 && s[0] == 5 && s[3] == 4, "axis 0");
    CHECKF(!*kiln_error(g), "%s", kiln_error(g));
    kiln_graph_free(g);
}

/* One failing builder call per graph: the message must say what is wrong. */
static void expect_gather_error(int drank, int irank, kiln_dtype idt, int axis, const char *msg) {
    kiln_graph *g = kiln_graph_new();
    int64_t s[KILN_MAX_RANK];
    for (int k = 0; k < KILN_MAX_RANK; k++) s[k] = 2;
    kiln_value x = kiln_input(g, "x", KILN_F32, drank, s);
    kiln_value i = kiln_input(g, "i", idt, irank, s);
    EXPECT(kiln_gather(g, x, i, axis) == KILN_NONE, "gather accepted (%s)", msg);
    EXPECT(strstr(kiln_error(g), msg), "message '%s', want '%s'", kiln_error(g), msg);
    kiln_graph_free(g);
}

TEST(gather_builder_errors) {
    expect_gather_error(2, 1, KILN_F32, 2, "gather: dim 2 is out of range for a tensor of rank 2");
    expect_gather_error(2, 1, KILN_F32, -3, "gather: dim -3 is out of range");
    expect_gather_error(2, 1, KILN_BOOL, 0, "gather expects an f32 tensor, got bool");
    expect_gather_error(0, 1, KILN_F32, 0, "gather: data must have at least 1 dim");
    expect_gather_error(KILN_MAX_RANK, 2, KILN_F32, 0, "gather: result rank");
}

static kiln_conv_transpose_params ct(int s, int p, int op, int d, int groups) {
    return (kiln_conv_transpose_params){{s, s}, {p, p}, {op, op}, {d, d}, groups};
}

/* conv_transpose2d of x [1, cin, 5, 4] and w [wc, cog, 3, 3]: the status,
 * the message when it fails, the output shape when it does not. */
static kiln_value try_ct(kiln_graph **gp, int cin, int wc, int cog, int nbias,
                         kiln_conv_transpose_params p) {
    kiln_graph *g = *gp = kiln_graph_new();
    kiln_value x = kiln_input(g, "x", KILN_F32, 4, (int64_t[]){1, cin, 5, 4});
    kiln_value w = kiln_input(g, "w", KILN_F32, 4, (int64_t[]){wc, cog, 3, 3});
    kiln_value b = nbias ? kiln_input(g, "b", KILN_F32, 1, (int64_t[]){nbias}) : KILN_NONE;
    return kiln_conv_transpose2d(g, x, w, b, &p);
}

static void expect_ct_error(int cin, int wc, int cog, int nbias, kiln_conv_transpose_params p,
                            const char *msg) {
    kiln_graph *g;
    EXPECT(try_ct(&g, cin, wc, cog, nbias, p) == KILN_NONE, "accepted (%s)", msg);
    EXPECT(strstr(kiln_error(g), msg), "message '%s', want '%s'", kiln_error(g), msg);
    kiln_graph_free(g);
}

static void expect_ct_shape(int cin, int cog, kiln_conv_transpose_params p, int64_t c, int64_t h,
                            int64_t w) {
    kiln_graph *g;
    kiln_value y = try_ct(&g, cin, cin, cog, 0, p);
    const int64_t *s = y >= 0 ? kiln_value_shape(g, y) : NULL;
    EXPECT(s && s[0] == 1 && s[1] == c && s[2] == h && s[3] == w,
           "shape: %s; want [1, %lld, %lld, %lld]", y >= 0 ? "differs" : kiln_error(g),
           (long long)c, (long long)h, (long long)w);
    kiln_graph_free(g);
}

TEST(conv_transpose_builder) {
    /* stride*(in-1) + output_padding + dilation*(k-1) + 1 - 2*padding */
    expect_ct_shape(2, 3, ct(1, 0, 0, 1, 1), 3, 7, 6);
    expect_ct_shape(2, 3, ct(2, 1, 1, 1, 1), 3, 10, 8);
    expect_ct_shape(4, 3, ct(3, 0, 2, 1, 2), 6, 17, 14);
    expect_ct_shape(2, 1, ct(1, 2, 1, 2, 1), 1, 6, 5); /* output_padding < dilation */
    expect_ct_error(2, 2, 3, 0, ct(2, 0, 2, 1, 1),
                    "conv_transpose2d: output_padding 2 must be smaller than stride 2 or "
                    "dilation 1 (dim 2)");
    expect_ct_error(2, 2, 3, 0, ct(1, 0, 1, 1, 1), "output_padding 1 must be smaller");
    expect_ct_error(3, 3, 3, 0, ct(1, 0, 0, 1, 2),
                    "conv_transpose2d: groups=2 must divide input channels 3");
    expect_ct_error(3, 3, 3, 0, ct(1, 0, 0, 1, 0), "groups=0 must divide");
    expect_ct_error(3, 2, 3, 0, ct(1, 0, 0, 1, 1),
                    "conv_transpose2d: weight has 2 input channels (dim 0), input has 3");
    expect_ct_error(4, 4, 3, 3, ct(1, 0, 0, 1, 2),
                    "conv_transpose2d: bias must have shape [6], got [3]");
    expect_ct_error(2, 2, 3, 0, ct(0, 0, 0, 1, 1), "stride and dilation must be >= 1");
    expect_ct_error(2, 2, 3, 0, ct(1, -1, 0, 1, 1), "padding and output_padding >= 0");
    expect_ct_error(2, 2, 3, 0, ct(1, 4, 0, 1, 1),
                    "conv_transpose2d: output size -1 in dim 2 is not positive");
    kiln_graph *g = kiln_graph_new();
    kiln_value x = kiln_input(g, "x", KILN_F32, 3, (int64_t[]){1, 2, 5});
    kiln_value w = kiln_input(g, "w", KILN_F32, 4, (int64_t[]){1, 2, 3, 3});
    EXPECT(kiln_conv_transpose2d(g, x, w, KILN_NONE, NULL) == KILN_NONE &&
               strstr(kiln_error(g), "must be 4-D"),
           "rank 3 input: %s", kiln_error(g));
    kiln_graph_free(g);
    g = kiln_graph_new(); /* NULL params: stride 1, no padding */
    x = kiln_input(g, "x", KILN_F32, 4, (int64_t[]){1, 2, 5, 4});
    w = kiln_input(g, "w", KILN_F32, 4, (int64_t[]){2, 1, 3, 2});
    kiln_value y = kiln_conv_transpose2d(g, x, w, KILN_NONE, NULL);
    EXPECT(y >= 0 && kiln_value_shape(g, y)[2] == 7 && kiln_value_shape(g, y)[3] == 5,
           "defaults: %s", kiln_error(g));
    kiln_graph_free(g);
}

/* ===== gather: compiled against the interpreter ================================= */

static void build_gather(Prog *P) {
    kiln_graph *g = P->g = kiln_graph_new();
    kiln_value x = input(P, "x", 3, (int64_t[]){6, 7, 5});
    kiln_value i1 = indices(P, "i1", 1, (int64_t[]){4}, -7, 6);
    kiln_value i2 = indices(P, "i2", 2, (int64_t[]){2, 3}, -6, 5);
    kiln_value i0 = indices(P, "i0", 0, NULL, -5, 4);
    kiln_value e = weight(P, "e", 2, (int64_t[]){64, 300}, 3);
    kiln_value tok = indices(P, "tok", 2, (int64_t[]){40, 50}, -64, 63);
    kiln_output(g, kiln_gather(g, x, i1, 1), "ax1");
    kiln_output(g, kiln_gather(g, x, i2, 0), "ax0_2d");
    kiln_output(g, kiln_gather(g, x, i0, -1), "axm1_0d");
    kiln_output(g, kiln_gather(g, kiln_transpose(g, x, 0, 2), i1, 1), "of_transpose");
    kiln_output(g, kiln_gather(g, kiln_slice(g, x, 1, 1, 7, 2), i0, 2), "of_slice");
    kiln_value row = kiln_reshape(g, kiln_slice(g, x, 0, 2, 3, 1), 2, (int64_t[]){7, 5});
    kiln_output(
        g,
        kiln_gather(g,
                    kiln_expand(g,
                                kiln_reshape(g, kiln_slice(g, row, 0, 0, 1, 1), 1, (int64_t[]){5}),
                                2, (int64_t[]){3, 5}),
                    i0, 1),
        "of_expand");
    kiln_output(g, kiln_gather(g, x, kiln_transpose(g, i2, 0, 1), 0), "idx_view");
    kiln_value half = kiln_unary(g, "floor", kiln_binary(g, "mul", i1, kiln_scalar(g, 0.5)));
    kiln_output(g, kiln_gather(g, kiln_unary(g, "sin", x), half, 1), "computed");
    kiln_output(g, kiln_gather(g, e, tok, 0), "embed");
    kiln_value emb = kiln_gather(g, e, tok, 0);
    kiln_value act =
        kiln_binary(g, "add", kiln_binary(g, "mul", emb, kiln_scalar(g, 2)), kiln_scalar(g, 1));
    kiln_output(g, kiln_unary(g, "relu", act), "embed_relu");
}

TEST(gather_fused_vs_interpreter) {
    Prog P = {0};
    build_gather(&P);
    CHECKF(!*kiln_error(P.g), "build: %s", kiln_error(P.g));
    const char *exact = "ax1,ax0_2d,axm1_0d,of_transpose,of_slice,of_expand,idx_view,embed";
    if (compile_and_compare(&P, NULL, exact)) {
        const Kernel *k = kernel_of(&P, "embed_relu");
        EXPECT(k && k->kind == KK_EXTERN && !strcmp(k->kernel, "extern_kernels.gather") &&
                   k->n == 2,
               "relu(gather * 2 + 1) is not the gather's epilogue");
    }
    test_prog_free(&P);
}

/* The same with epilogues off: every consumer is a kernel of its own. */
TEST(gather_no_extern_epilogue) {
    Prog P = {0};
    build_gather(&P);
    kiln_options o = kiln_default_options();
    o.extern_epilogue = 0;
    if (compile_and_compare(&P, &o, "embed")) {
        const Kernel *k = kernel_of(&P, "embed_relu");
        EXPECT(k && k->kind != KK_EXTERN, "epilogue fused although switched off");
    }
    test_prog_free(&P);
}

/* ===== gather: an index out of range at run time ================================= */

/* Set i[0..3] and run p; the status and message must be as given, in the
 * compiled program and in the interpreter. */
static void expect_run(kiln_graph *g, kiln_program *p, kiln_tensor *in, const float *idx,
                       kiln_status want, const char *msg) {
    memcpy(in[1].data, idx, 4 * sizeof(float));
    kiln_tensor out[1] = {{0}};
    kiln_status st = kiln_program_run(p, in, out);
    EXPECT(st == want, "compiled: status %d, want %d (%s)", st, want, kiln_program_error(p));
    if (msg)
        EXPECT(!strcmp(kiln_program_error(p), msg), "compiled: '%s', want '%s'",
               kiln_program_error(p), msg);
    EXPECT(st != KILN_OK || out[0].data, "no output");
    kiln_tensor_free(&out[0]);
    st = kiln_interpret(g, in, out);
    EXPECT(st == want, "interpreted: status %d, want %d", st, want);
    if (msg)
        EXPECT(!strcmp(kiln_error(g), msg), "interpreted: '%s', want '%s'", kiln_error(g), msg);
    kiln_tensor_free(&out[0]);
}

TEST(gather_index_out_of_range) {
    kiln_graph *g = kiln_graph_new();
    kiln_value x = kiln_input(g, "x", KILN_F32, 2, (int64_t[]){3, 5});
    kiln_value i = kiln_input(g, "i", KILN_F32, 1, (int64_t[]){4});
    kiln_output(g, kiln_unary(g, "relu", kiln_gather(g, x, i, 1)), "y"); /* with epilogue */
    kiln_program *p = NULL;
    CHECKF(test_compile_in_cache(g, "gather-cache", NULL, &p) == KILN_OK, "compile: %s",
           kiln_error(g));
    kiln_tensor in[2] = {kiln_input_desc(g, 0), kiln_input_desc(g, 1)};
    kiln_tensor_alloc(&in[0]);
    kiln_tensor_alloc(&in[1]);
    kiln_fill_randn(in[0].data, 15, 1);
    expect_run(g, p, in, (float[]){0, 4, -5, -1}, KILN_OK, NULL);
    expect_run(g, p, in, (float[]){0, 7, 9, 1}, KILN_ERR_INPUT,
               "gather: index 7 out of range for dim 1 of size 5");
    expect_run(g, p, in, (float[]){1, 2, -6, 5}, KILN_ERR_INPUT,
               "gather: index -6 out of range for dim 1 of size 5");
    expect_run(g, p, in, (float[]){1, 2.5f, 3, 0}, KILN_ERR_INPUT,
               "gather: index 2.5 is not an integer");
    expect_run(g, p, in, (float[]){NAN, 0, 0, 0}, KILN_ERR_INPUT,
               "gather: index nan is not an integer");
    expect_run(g, p, in, (float[]){INFINITY, 0, 0, 0}, KILN_ERR_INPUT,
               "gather: index inf is not an integer");
    expect_run(g, p, in, (float[]){3e9f, 0, 0, 0}, KILN_ERR_INPUT,
               "gather: index 3000000000 out of range for dim 1 of size 5");
    expect_run(g, p, in, (float[]){4, 3, 2, 1}, KILN_OK, NULL); /* usable again */
    kiln_tensor_free(&in[0]);
    kiln_tensor_free(&in[1]);
    kiln_program_free(p);
    kiln_graph_free(g);
}

/* ===== ext_gather's epilogue contract ================================================ */

/* Counts how often each element reached the epilogue and whether it had
 * been written (the data is all ones; the output starts at zero). */
typedef struct {
    int *seen;
    int written_late;
} EpiCount;

static void count_epi(void *ctx, float *c, int64_t start, int64_t count) {
    EpiCount *e = ctx;
    for (int64_t k = start; k < start + count; k++) {
#pragma omp atomic
        e->seen[k]++;
        if (c[k] != 1.0f) {
#pragma omp atomic write
            e->written_late = 1;
        }
    }
}

TEST(ext_gather_epilogue_ranges) {
    int64_t ds[3] = {3, 50, 700}, is[1] = {97}; /* 3 * 97 * 700 = 203700 outputs */
    ExtView dv = test_dense_view(3, ds), iv = test_dense_view(1, is);
    int64_t n = 3 * 97 * 700;
    float *data = malloc(sizeof(float) * 3 * 50 * 700), *out = calloc((size_t)n, sizeof(float));
    float idx[97];
    for (int k = 0; k < 3 * 50 * 700; k++) data[k] = 1.0f;
    for (int k = 0; k < 97; k++) idx[k] = (float)(k % 100 - 50);
    EpiCount e = {calloc((size_t)n, sizeof(int)), 0};
    int saved = ext_get_threads();
    ext_set_threads(4);
    char err[128] = "";
    int rc = ext_gather(data, &dv, idx, &iv, 1, out, count_epi, &e, err, sizeof err);
    ext_set_threads(saved);
    EXPECT(rc == 0, "rc %d (%s)", rc, err);
    int64_t bad = 0;
    for (int64_t k = 0; k < n; k++) bad += e.seen[k] != 1;
    EXPECT(bad == 0, "%lld elements not handed to the epilogue exactly once", (long long)bad);
    EXPECT(!e.written_late, "the epilogue saw an element before it was written");
    idx[40] = 50; /* out of range: nothing may be written, no epilogue runs */
    memset(out, 0, sizeof(float) * (size_t)n);
    memset(e.seen, 0, sizeof(int) * (size_t)n);
    rc = ext_gather(data, &dv, idx, &iv, 1, out, count_epi, &e, err, sizeof err);
    EXPECT(rc == EXT_ERR_INPUT &&
               !strcmp(err, "gather: index 50 out of range for dim 1 of size 50"),
           "rc %d, '%s'", rc, err);
    int64_t touched = 0;
    for (int64_t k = 0; k < n; k++) touched += out[k] != 0.0f || e.seen[k];
    EXPECT(touched == 0, "%lld elements written before the index check", (long long)touched);
    free(data);
    free(out);
    free(e.seen);
}

/* ===== conv_transpose2d: compiled against the interpreter =========================== */

static kiln_value ct_out(Prog *P, const char *name, kiln_value x, int64_t cin, int64_t cog, int kh,
                         int kw, bool bias, kiln_conv_transpose_params p) {
    kiln_graph *g = P->g;
    char wn[64], bn[64];
    snprintf(wn, sizeof wn, "%s_w", name);
    snprintf(bn, sizeof bn, "%s_b", name);
    kiln_value w = weight(P, wn, 4, (int64_t[]){cin, cog, kh, kw}, 40 + (uint64_t)P->nin);
    kiln_value b = bias ? weight(P, bn, 1, (int64_t[]){cog * p.groups}, 7) : KILN_NONE;
    kiln_value y = kiln_conv_transpose2d(g, x, w, b, &p);
    kiln_output(g, y, name);
    return y;
}

static void build_ct(Prog *P) {
    kiln_graph *g = P->g = kiln_graph_new();
    kiln_value x = input(P, "x", 4, (int64_t[]){2, 4, 5, 3});
    kiln_value big = input(P, "big", 4, (int64_t[]){1, 16, 24, 24});
    ct_out(P, "plain", x, 4, 3, 3, 3, false, ct(1, 0, 0, 1, 1));
    ct_out(P, "up2", x, 4, 2, 3, 3, true, ct(2, 1, 1, 1, 1));
    kiln_conv_transpose_params mix = {{2, 3}, {1, 0}, {1, 2}, {1, 2}, 2};
    ct_out(P, "mixed", x, 4, 3, 3, 2, true, mix);
    ct_out(P, "depthwise", x, 4, 1, 4, 4, true, ct(2, 1, 0, 1, 4));
    ct_out(P, "dilated", x, 4, 2, 3, 3, false, ct(1, 2, 1, 2, 1));
    ct_out(P, "k1_stride3", x, 4, 5, 1, 1, true, ct(3, 0, 2, 1, 2));
    kiln_value xt = kiln_transpose(g, x, 2, 3); /* a view the library needs packed */
    ct_out(P, "of_view", xt, 4, 2, 2, 2, false, ct(2, 0, 0, 1, 1));
    /* large enough for the parallel col2im and epilogue per plane */
    kiln_value y = ct_out(P, "big_plain", big, 16, 8, 4, 4, true, ct(2, 1, 0, 1, 1));
    kiln_output(g, kiln_unary(g, "relu", y), "big_relu");
    /* taps that tile the output (kernel = stride, no padding): col2im is
     * a shuffle, two taps across interleaved four columns at a time */
    kiln_value u = ct_out(P, "up2x2", big, 16, 8, 2, 2, true, ct(2, 0, 0, 1, 1));
    kiln_output(g, kiln_unary(g, "sigmoid", u), "up2x2_sigmoid");
    ct_out(P, "k3_stride3", x, 4, 2, 3, 3, true, ct(3, 0, 0, 1, 1));
    ct_out(P, "k2_groups", x, 4, 3, 2, 2, true, ct(2, 0, 0, 1, 2));
    ct_out(P, "k2_outpad", x, 4, 2, 2, 2, true, ct(2, 0, 1, 1, 1)); /* a last row of bias */
    kiln_value s = ct_out(P, "small", x, 4, 2, 3, 3, true, ct(2, 1, 1, 1, 1));
    kiln_value r = kiln_binary(g, "mul", kiln_unary(g, "relu", s), kiln_scalar(g, 3));
    kiln_output(g, r, "small_relu");
}

TEST(conv_transpose_fused_vs_interpreter) {
    Prog P = {0};
    build_ct(&P);
    CHECKF(!*kiln_error(P.g), "build: %s", kiln_error(P.g));
    if (compile_and_compare(&P, NULL, NULL)) {
        const Kernel *k = kernel_of(&P, "small_relu");
        EXPECT(k && k->kind == KK_EXTERN && !strcmp(k->kernel, "extern_kernels.conv_transpose2d") &&
                   k->n == 2,
               "relu(conv_transpose2d) * 3 is not the call's epilogue");
        k = kernel_of(&P, "big_relu");
        EXPECT(k && k->kind == KK_EXTERN && k->n == 2, "big relu is not an epilogue");
    }
    test_prog_free(&P);
}

/* What the reports say runs a conv_transpose2d: the shuffle exactly where
 * the taps tile the output (kernel = stride, no padding or output padding,
 * dilation 1), col2im elsewhere. */
TEST(conv_transpose_path) {
    static const struct {
        int64_t k, s, p, op, d;
        bool shuffle;
    } cases[] = {{2, 2, 0, 0, 1, true},  {3, 3, 0, 0, 1, true},  {2, 2, 1, 0, 1, false},
                 {2, 2, 0, 1, 1, false}, {3, 2, 0, 0, 1, false}, {2, 2, 0, 0, 2, false}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int64_t k = cases[i].k, st = cases[i].s, h = 6;
        int64_t o = st * (h - 1) + cases[i].op + cases[i].d * (k - 1) + 1 - 2 * cases[i].p;
        int64_t xs[4] = {1, 4, h, h}, ws[4] = {4, 3, k, k}, ys[4] = {1, 3, o, o};
        int64_t attr[9] = {st,          st,         cases[i].p, cases[i].p, cases[i].op,
                           cases[i].op, cases[i].d, cases[i].d, 1};
        const char *path = ext_conv_transpose_path(xs, ws, ys, attr);
        EXPECT(strstr(path, cases[i].shuffle ? "shuffle" : "col2im"), "case %zu: %s", i, path);
    }
}

/* One thread and four: the parallel col2im and per-plane epilogue agree. */
TEST(conv_transpose_threads) {
    Prog P = {0};
    build_ct(&P);
    kiln_options o = kiln_default_options();
    o.threads = 1;
    kiln_tensor one[TEST_MAXIO];
    if (compile_and_compare(&P, &o, NULL)) {
        kiln_program *p4 = NULL;
        o.threads = 4;
        CHECKF(test_compile_in_cache(P.g, "gather-cache", &o, &p4) == KILN_OK, "%s",
               kiln_error(P.g));
        CHECKF(kiln_program_run(p4, P.in, one) == KILN_OK, "%s", kiln_program_error(p4));
        RtTolerance tol = rt_tolerance(rt_graph(kiln_program_rt(p4)));
        for (int i = 0; i < kiln_num_outputs(P.g); i++) {
            const float *a = P.got[i].data, *b = one[i].data;
            for (int64_t k = 0; k < kiln_tensor_numel(&one[i]); k++)
                if (!(rt_excess(b[k], a[k], tol) <= 1.0)) {
                    test_failf(__FILE__, __LINE__, "%s[%lld]: 4 threads %.8g, 1 thread %.8g",
                               kiln_output_name(P.g, i), (long long)k, b[k], a[k]);
                    break;
                }
            kiln_tensor_free(&one[i]);
        }
        kiln_program_free(p4);
    }
    test_prog_free(&P);
}

/* ===== traffic ============================================================== */

/* The traffic report charges a gather with the rows its indices pick, not
 * the whole table (an embedding lookup reads 5 rows of 1000), both fused
 * and unfused; more indices than rows read the whole tensor once. */
TEST(gather_traffic_counts_picked_rows) {
    static const struct {
        int64_t d0, d1, nidx;
        int axis;
        int64_t read; /* bytes of data read */
    } cases[] = {
        {1000, 64, 5, 0, 5 * 64 * 4},
        {64, 1000, 7, 1, 64 * 7 * 4},
        {1000, 64, 3000, 0, 1000 * 64 * 4},
    };
    for (int c = 0; c < 3; c++) {
        kiln_graph *g = kiln_graph_new();
        int64_t ts[2] = {cases[c].d0, cases[c].d1}, is[1] = {cases[c].nidx};
        kiln_value t = kiln_input(g, "t", KILN_F32, 2, ts), i = kiln_input(g, "i", KILN_F32, 1, is);
        kiln_output(g, kiln_gather(g, t, i, cases[c].axis), "y");
        KilnConfig cfg = kiln_config_default();
        cfg.logs = 0;
        Plan *p = NULL;
        char err[256];
        CHECKF(plan_build(g, &cfg, &p, err, sizeof err) == KILN_OK, "%s", err);
        int64_t out = (cases[c].axis == 0 ? cases[c].d1 : cases[c].d0) * cases[c].nidx * 4;
        int64_t want = cases[c].read + cases[c].nidx * 4 + out;
        EXPECT(p->sched->fused_bytes == want && p->sched->unfused_bytes == want,
               "case %d: fused %lld, unfused %lld bytes, want %lld", c,
               (long long)p->sched->fused_bytes, (long long)p->sched->unfused_bytes,
               (long long)want);
        plan_free(p);
        kiln_graph_free(g);
    }
}
