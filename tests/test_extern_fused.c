/*
 * test_extern_fused.c -- matmul and conv2d through the compiled path
 * (kiln_compile + kiln_program_run: lowering of extern operands to strided
 * views, the generated wrapper, OpenBLAS and im2col) against the reference
 * interpreter, over the shapes extern kernels must handle: odd sizes, 1x1,
 * 3x3 and 7x7 kernels, stride 2, dilation, groups and depthwise, batch
 * broadcasting, 1-D operands, transposed and sliced views as operands,
 * Conv-BN-ReLU with constant and with runtime parameters, and a residual
 * add.
 *
 * A cold compile costs a C compiler run, so the cases are packed into two
 * programs with many outputs (one for matmul, one for conv2d). The JIT cache
 * is a fresh directory under test_tmpdir(). Tolerance: rt_tolerance of the
 * program (src/ref/tolerance.c), as in test_fused.c.
 *
 * Views: a transposed or sliced operand must reach BLAS as a transpose flag
 * or a leading dimension, never as a copy. The loop program shows the
 * operand as a view of the original buffer with its strides; calling
 * ext_matmul on those views while every allocation is refused proves the
 * library takes them without packing a temporary.
 */
#include "test.h"
#include "testutil.h"
#include "runtime/runtime.h"

typedef TestProg Prog;

static kiln_value input(Prog *P, const char *name, int rank, const int64_t *shape) {
    return test_prog_input(P, name, rank, shape, 500);
}

static kiln_value weight(Prog *P, const char *name, int rank, const int64_t *shape, uint64_t seed) {
    return test_random_weight(P->g, name, rank, shape, seed);
}

/* Compile in a fresh cache, run fused and interpreted, compare every output. */
static bool compile_and_compare(Prog *P) {
    return test_prog_check(P, "extern-fused-cache", NULL, NULL);
}

static int output_index(const kiln_graph *g, const char *name) {
    for (int i = 0; i < kiln_num_outputs(g); i++)
        if (!strcmp(kiln_output_name(g, i), name)) return i;
    return -1;
}

/* The buffer holding output `name` in the compiled program's loop IR. */
static const Buffer *out_buffer(Prog *P, const char *name) {
    const LoopProgram *lp = rt_schedule(kiln_program_rt(P->p))->prog;
    int i = output_index(P->g, name);
    return i < 0 ? NULL : lp->bufs[lp->outputs[i]];
}

static const Buffer *buffer(Prog *P, int id) {
    return rt_schedule(kiln_program_rt(P->p))->prog->bufs[id];
}

/* ===== matmul ============================================================== */

static void build_mm(Prog *P) {
    kiln_graph *g = P->g = kiln_graph_new();
    kiln_value a = input(P, "a", 2, (int64_t[]){7, 13}), b = input(P, "b", 2, (int64_t[]){13, 5});
    kiln_value p = input(P, "p", 4, (int64_t[]){2, 1, 3, 4});
    kiln_value q = input(P, "q", 3, (int64_t[]){5, 4, 6});
    kiln_value v = input(P, "v", 1, (int64_t[]){13});
    kiln_value x = input(P, "x", 2, (int64_t[]){9, 5});
    kiln_value c = input(P, "c", 2, (int64_t[]){5, 13});
    kiln_value s = input(P, "s", 2, (int64_t[]){6, 10}), r = input(P, "r", 2, (int64_t[]){8, 3});
    kiln_value kq = input(P, "kq", 4, (int64_t[]){2, 3, 4, 5});
    kiln_value kk = input(P, "kk", 4, (int64_t[]){2, 3, 6, 5});
    kiln_value w = weight(P, "w", 2, (int64_t[]){9, 7}, 1);
    kiln_value bias = weight(P, "bias", 1, (int64_t[]){5}, 2);
    kiln_output(g, kiln_matmul(g, a, b), "odd");
    kiln_output(g, kiln_matmul(g, p, q), "bcast");
    kiln_output(g, kiln_matmul(g, a, v), "mv");
    kiln_output(g, kiln_matmul(g, v, b), "vm");
    kiln_output(g, kiln_matmul(g, v, v), "vv");
    kiln_output(g, kiln_matmul(g, kiln_transpose(g, w, 0, 1), x), "wT_x");
    kiln_output(g, kiln_matmul(g, a, kiln_transpose(g, c, 0, 1)), "a_cT");
    kiln_output(g, kiln_matmul(g, kiln_slice(g, s, 1, 1, 9, 1), r), "sliced");
    kiln_value s2 = kiln_slice(g, kiln_slice(g, s, 0, 0, 6, 2), 1, 2, 10, 1);
    kiln_output(g, kiln_matmul(g, s2, kiln_slice(g, r, 1, 1, 3, 1)), "sliced2");
    kiln_output(g, kiln_matmul(g, kq, kiln_transpose(g, kk, -1, -2)), "qkT");
    kiln_value lin = kiln_binary(g, "add", kiln_matmul(g, a, b), bias);
    kiln_output(g, kiln_unary(g, "gelu", lin), "linear_bias_gelu");
    kiln_value seed =
        kiln_matmul(g, kiln_binary(g, "add", c, kiln_scalar(g, 1)), kiln_transpose(g, a, 0, 1));
    kiln_output(g, kiln_unary(g, "relu", seed), "seed");
}

/* Operand k of the extern computing output name: a view of the buffer of
 * kind `body` (not a copy) with the last two strides given. */
static void expect_view(Prog *P, const char *name, int k, BodyKind body, int64_t s0, int64_t s1,
                        int64_t offset) {
    const Buffer *b = out_buffer(P, name);
    if (!b || b->body != BODY_EXTERN) {
        test_failf(__FILE__, __LINE__, "%s: not an extern output", name);
        return;
    }
    const BufView *v = &b->opnd[k];
    const Buffer *src = buffer(P, v->buf);
    EXPECT(src->body == body, "%s operand %d: reads %s, a copy", name, k, src->name);
    EXPECT(v->stride[v->rank - 2] == s0 && v->stride[v->rank - 1] == s1 && v->offset == offset,
           "%s operand %d: strides %lld %lld offset %lld", name, k,
           (long long)v->stride[v->rank - 2], (long long)v->stride[v->rank - 1],
           (long long)v->offset);
}

/* Allocation refused: ext_matmul may not pack a temporary. */
static void *refuse(void *ud, void *ptr, size_t old, size_t n) {
    (void)ud;
    (void)old;
    if (n == 0) free(ptr);
    return NULL;
}

static ExtView ext_view(const BufView *v) {
    ExtView e = {v->rank, {0}, {0}, v->offset};
    memcpy(e.shape, v->shape, sizeof e.shape);
    memcpy(e.stride, v->stride, sizeof e.stride);
    return e;
}

/* Run the extern of output name again on its views with allocation refused;
 * the result must equal the fused output. */
static void expect_no_pack(Prog *P, const char *name, const float *const *bufdata) {
    const Buffer *b = out_buffer(P, name);
    int i = output_index(P->g, name);
    if (!b || b->body != BODY_EXTERN || i < 0) return;
    ExtView av = ext_view(&b->opnd[0]), bv = ext_view(&b->opnd[1]);
    float *c = malloc(sizeof(float) * (size_t)b->numel);
    kiln_set_allocator(refuse, NULL);
    int rc = ext_matmul(bufdata[b->opnd[0].buf], &av, bufdata[b->opnd[1].buf], &bv, c, b->rank,
                        b->shape);
    kiln_set_allocator(NULL, NULL);
    EXPECT(rc == 0, "%s: ext_matmul needed a scratch copy", name);
    const float *want = P->got[i].data;
    for (int64_t k = 0; rc == 0 && k < b->numel; k++)
        if (c[k] != want[k]) {
            test_failf(__FILE__, __LINE__, "%s[%lld]: %g vs fused %g", name, (long long)k, c[k],
                       want[k]);
            break;
        }
    free(c);
}

TEST(extern_fused_matmul) {
    Prog P = {0};
    build_mm(&P);
    CHECKF(kiln_error(P.g)[0] == 0, "%s", kiln_error(P.g));
    if (!compile_and_compare(&P)) {
        test_prog_free(&P);
        return;
    }
    /* transposed and sliced operands are views of the original buffers */
    expect_view(&P, "wT_x", 0, BODY_WEIGHT, 1, 7, 0);
    expect_view(&P, "a_cT", 1, BODY_INPUT, 1, 13, 0);
    expect_view(&P, "sliced", 0, BODY_INPUT, 10, 1, 1);
    expect_view(&P, "sliced2", 0, BODY_INPUT, 20, 1, 2);
    expect_view(&P, "sliced2", 1, BODY_INPUT, 3, 1, 1);
    expect_view(&P, "qkT", 1, BODY_INPUT, 1, 5, 0);
    /* and BLAS takes those views as they are */
    const LoopProgram *lp = rt_schedule(kiln_program_rt(P.p))->prog;
    const float *data[64] = {0};
    for (int i = 0; i < lp->nbufs && i < 64; i++) {
        const Buffer *b = lp->bufs[i];
        if (b->body == BODY_WEIGHT) data[i] = b->data;
        for (int k = 0; k < lp->ninputs; k++)
            if (lp->inputs[k] == i) data[i] = P.in[k].data;
    }
    expect_no_pack(&P, "wT_x", data);
    expect_no_pack(&P, "a_cT", data);
    expect_no_pack(&P, "sliced", data);
    expect_no_pack(&P, "sliced2", data);
    expect_no_pack(&P, "qkT", data);
    test_prog_free(&P);
}

/* ===== conv2d ================================================================ */

static kiln_value conv(kiln_graph *g, kiln_value x, kiln_value w, kiln_value b, int stride, int pad,
                       int dil, int groups) {
    kiln_conv_params p = {{stride, stride}, {pad, pad}, {dil, dil}, groups};
    return kiln_conv2d(g, x, w, b, &p);
}

static void build_conv(Prog *P) {
    kiln_graph *g = P->g = kiln_graph_new();
    int64_t c6[1] = {6}, c5[1] = {5}, c12[1] = {12};
    kiln_value x = input(P, "x", 4, (int64_t[]){2, 6, 11, 9});
    kiln_value w1 = input(P, "w1", 4, (int64_t[]){4, 6, 1, 1});
    kiln_value w3 = input(P, "w3", 4, (int64_t[]){5, 6, 3, 3});
    kiln_value b3 = input(P, "b3", 1, c5);
    kiln_value w7 = weight(P, "w7", 4, (int64_t[]){4, 6, 7, 7}, 11);
    kiln_value b7 = weight(P, "b7", 1, (int64_t[]){4}, 12);
    kiln_value wd = input(P, "wd", 4, (int64_t[]){3, 6, 3, 3});
    kiln_value wg = input(P, "wg", 4, (int64_t[]){4, 3, 3, 3});
    kiln_value wdw = weight(P, "wdw", 4, (int64_t[]){6, 1, 3, 3}, 13);
    kiln_value wdw2 = input(P, "wdw2", 4, (int64_t[]){12, 1, 5, 5});
    kiln_value b12 = input(P, "b12", 1, c12);
    kiln_value wr = weight(P, "wr", 4, (int64_t[]){6, 6, 3, 3}, 14);
    /* Conv-BN-ReLU, constant: folds into one conv */
    kiln_value wc = weight(P, "wc", 4, (int64_t[]){6, 6, 3, 3}, 15);
    kiln_value m = weight(P, "m", 1, c6, 16), ga = weight(P, "ga", 1, c6, 17);
    kiln_value be = weight(P, "be", 1, c6, 18);
    float ones[6] = {1, 1.5f, 0.5f, 2, 1, 0.75f};
    kiln_value var = kiln_weight(g, "var", 1, c6, ones);
    /* Conv-BN-ReLU, runtime parameters: BN stays pointwise */
    kiln_value rm = input(P, "rm", 1, c5), rv = input(P, "rv", 1, c5);
    kiln_value rg = input(P, "rg", 1, c5), rb = input(P, "rb", 1, c5);
    float *rvd = P->in[P->nin - 3].data;
    for (int i = 0; i < 5; i++) rvd[i] = 0.5f + (float)i * 0.25f;
    kiln_output(g, conv(g, x, w1, KILN_NONE, 1, 0, 1, 1), "c1x1");
    kiln_output(g, conv(g, x, w1, KILN_NONE, 2, 0, 1, 1), "c1x1_s2");
    kiln_output(g, conv(g, x, w3, b3, 1, 1, 1, 1), "c3");
    kiln_output(g, conv(g, x, w3, KILN_NONE, 2, 0, 1, 1), "c3_s2");
    kiln_output(g, conv(g, x, w7, b7, 2, 3, 1, 1), "c7_s2");
    kiln_output(g, conv(g, x, wd, KILN_NONE, 1, 2, 2, 1), "dil2");
    kiln_output(g, conv(g, x, wg, KILN_NONE, 1, 1, 1, 2), "groups2");
    kiln_output(g, conv(g, x, wdw, KILN_NONE, 1, 1, 1, 6), "depthwise");
    kiln_output(g, conv(g, x, wdw2, b12, 2, 2, 1, 6), "depthwise_x2_s2");
    kiln_value cb = kiln_batch_norm(g, conv(g, x, wc, KILN_NONE, 1, 1, 1, 1), m, var, ga, be, 1e-5);
    kiln_output(g, kiln_unary(g, "relu", cb), "cbr_const");
    kiln_value rb_ =
        kiln_batch_norm(g, conv(g, x, w3, KILN_NONE, 1, 1, 1, 1), rm, rv, rg, rb, 1e-5);
    kiln_output(g, kiln_unary(g, "relu", rb_), "cbr_runtime");
    kiln_value res = kiln_binary(g, "add", conv(g, x, wr, KILN_NONE, 1, 1, 1, 1), x);
    kiln_output(g, kiln_unary(g, "relu", res), "residual");
}

static bool has_origin(const Buffer *b, const char *o) {
    for (int i = 0; i < b->norigins; i++)
        if (!strcmp(b->origins[i], o)) return true;
    return false;
}

/* 1x1 convolutions on kiln's own GEMM (conv1x1.c) with their epilogues,
 * against the interpreter: a runtime weight whose K = 600 rows split the
 * pixels into chunks (the epilogue then runs on parts of rows) with BN of
 * runtime parameters, a residual add and relu; a constant weight on 32x32
 * planes (x's chunks copied first) with a bias and relu; and MobileNetV2's
 * block, 1x1 expansion, depthwise 3x3, 1x1 projection, all constant. */
TEST(extern_fused_conv1x1) {
    Prog P = {0};
    kiln_graph *g = P.g = kiln_graph_new();
    int64_t c13[1] = {13}, c16[1] = {16};
    kiln_value x = input(&P, "x", 4, (int64_t[]){2, 600, 13, 11});
    kiln_value w = input(&P, "w", 4, (int64_t[]){13, 600, 1, 1});
    kiln_value m = input(&P, "m", 1, c13), v = input(&P, "v", 1, c13);
    kiln_value ga = input(&P, "ga", 1, c13), be = input(&P, "be", 1, c13);
    kiln_value r = input(&P, "r", 4, (int64_t[]){2, 13, 13, 11});
    float *vd = P.in[P.nin - 4].data;
    for (int i = 0; i < 13; i++) vd[i] = 0.5f + (float)i * 0.125f;
    kiln_value bn = kiln_batch_norm(g, conv(g, x, w, KILN_NONE, 1, 0, 1, 1), m, v, ga, be, 1e-5);
    kiln_output(g, kiln_unary(g, "relu", kiln_binary(g, "add", bn, r)), "chunks_bn_residual");
    kiln_value x32 = input(&P, "x32", 4, (int64_t[]){1, 300, 32, 32});
    kiln_value w32 = weight(&P, "w32", 4, (int64_t[]){16, 300, 1, 1}, 31);
    kiln_value b32 = weight(&P, "b32", 1, c16, 32);
    kiln_output(g, kiln_unary(g, "relu", conv(g, x32, w32, b32, 1, 0, 1, 1)), "copied_bias_relu");
    kiln_value xb = input(&P, "xb", 4, (int64_t[]){1, 24, 14, 14});
    kiln_value we = weight(&P, "we", 4, (int64_t[]){144, 24, 1, 1}, 33);
    kiln_value wdw = weight(&P, "wdw", 4, (int64_t[]){144, 1, 3, 3}, 34);
    kiln_value wp = weight(&P, "wp", 4, (int64_t[]){24, 144, 1, 1}, 35);
    kiln_value e = kiln_unary(g, "relu", conv(g, xb, we, KILN_NONE, 1, 0, 1, 1));
    kiln_value d = kiln_unary(g, "relu", conv(g, e, wdw, KILN_NONE, 1, 1, 1, 144));
    kiln_output(g, kiln_binary(g, "add", conv(g, d, wp, KILN_NONE, 1, 0, 1, 1), xb), "block");
    CHECKF(kiln_error(g)[0] == 0, "%s", kiln_error(g));
    compile_and_compare(&P);
    test_prog_free(&P);
}

TEST(extern_fused_conv2d) {
    Prog P = {0};
    build_conv(&P);
    CHECKF(kiln_error(P.g)[0] == 0, "%s", kiln_error(P.g));
    if (!compile_and_compare(&P)) {
        test_prog_free(&P);
        return;
    }
    const Schedule *s = rt_schedule(kiln_program_rt(P.p));
    int convs = 0;
    for (int k = 0; k < s->nkernels; k++)
        convs += !strcmp(s->kernels[k].kernel, "extern_kernels.conv2d");
    EXPECT(convs == 12, "%d conv calls", convs);
    /* constant Conv-BN-ReLU: the relu reads the folded conv directly */
    const Buffer *cc = out_buffer(&P, "cbr_const"), *cr = out_buffer(&P, "cbr_runtime");
    EXPECT(cc && cc->norigins == 1 && has_origin(cc, "relu"), "cbr_const is not relu(conv)");
    EXPECT(cc && cc->expr && cc->expr->kind == EX_OP && cc->expr->args[0]->kind == EX_LOAD &&
               buffer(&P, cc->expr->args[0]->buf)->body == BODY_EXTERN,
           "cbr_const: relu does not read the conv");
    EXPECT(cr && has_origin(cr, "batch_norm") && has_origin(cr, "relu"),
           "cbr_runtime: BN is not fused with relu");
    test_prog_free(&P);
}
