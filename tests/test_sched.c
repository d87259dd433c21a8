/*
 * test_sched.c -- the fusion scheduler against the seed experiments
 * (docs/design.md, "The seed experiments") and each can_fuse rule in
 * isolation.
 *
 * Each seed test asserts the structure of the decision (nodes before
 * scheduling, possible fusions per round, the pairs fused, the rejections
 * and their reasons, kernels with their names and loop nests, the call
 * sequence) and the memory traffic, which the test computes by hand from
 * the shapes: unfused, every op reads its operands and writes its result;
 * fused, every kernel loads each input once and stores what leaves it.
 */
#include "test.h"
#include "runtime/runtime.h" /* plan_build */

#define N 1024
#define NN ((int64_t)N * N)
#define F4 ((int64_t)4) /* bytes of an f32 */
static const int64_t SQ[2] = {N, N};

static KilnConfig quiet(void) {
    KilnConfig c = kiln_config_default();
    c.logs = 0;
    return c;
}

static Plan *compile_cfg(kiln_graph *g, const KilnConfig *c) {
    Plan *p = NULL;
    char err[256];
    kiln_status st = plan_build(g, c, &p, err, sizeof err);
    kiln_graph_free(g);
    if (st != KILN_OK) test_failf(__FILE__, __LINE__, "plan_build: %s", err);
    return p;
}

static Plan *compile(kiln_graph *g) {
    KilnConfig c = quiet();
    return compile_cfg(g, &c);
}

static bool was_rejected(const Schedule *s, const char *a, const char *b, const char *reason) {
    for (int i = 0; i < s->nrejected; i++)
        if (!strcmp(s->rejected[i].node1, a) && !strcmp(s->rejected[i].node2, b) &&
            !strncmp(s->rejected[i].reason, reason, strlen(reason)))
            return true;
    return false;
}

static int count_rejected(const Schedule *s, const char *reason) {
    int n = 0;
    for (int i = 0; i < s->nrejected; i++)
        n += !strncmp(s->rejected[i].reason, reason, strlen(reason));
    return n;
}

static bool fused(const Schedule *s, int round, int i, const char *a, const char *b) {
    const Round *r = &s->rounds[round - 1];
    return i < r->nfused && !strcmp(r->fused_a[i], a) && !strcmp(r->fused_b[i], b);
}

static bool calls_are(const Schedule *s, int n, const char *const *names) {
    if (s->nkernels != n) return false;
    for (int i = 0; i < n; i++)
        if (strcmp(s->kernels[i].kernel, names[i])) return false;
    return true;
}

/* ---- the seed experiments (docs/design.md) ------------------------------------- */

static int chain(kiln_graph *g, int x) {
    return kiln_unary(
        g, "sin",
        kiln_binary(g, "mul", kiln_unary(g, "relu", kiln_binary(g, "add", x, kiln_scalar(g, 1))),
                    kiln_scalar(g, 2)));
}

/* chain sin(relu(x+1)*2): 1 node, found 0 possible fusions, 1 kernel;
 * traffic 2kNs -> 2Ns with k = 4. */
TEST(sched_chain) {
    kiln_graph *g = kiln_graph_new();
    kiln_output(g, chain(g, kiln_input(g, "x", KILN_F32, 2, SQ)), "y");
    Plan *p = compile(g);
    CHECK(p);
    Schedule *s = p->sched;
    CHECK(s->nnodes == 1 && s->nrounds == 1 && s->rounds[0].possible == 0);
    static const char *const calls[] = {"cpp_fused_add_mul_relu_sin_0"};
    CHECK(calls_are(s, 1, calls));
    CHECK(s->kernels[0].kind == KK_POINTWISE && s->kernels[0].loop_nests == 1);
    EXPECT(s->unfused_bytes == 8 * F4 * NN, "unfused %lld", (long long)s->unfused_bytes);
    EXPECT(s->fused_bytes == 2 * F4 * NN, "fused %lld", (long long)s->fused_bytes);
    EXPECT(s->peak_bytes == 2 * F4 * NN, "peak %lld", (long long)s->peak_bytes);
    plan_free(p);
}

/* rowsum sum(relu(x+1), dim=1): the pointwise is inlined into the reduction. */
TEST(sched_rowsum) {
    kiln_graph *g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 2, SQ), d = 1;
    int r = kiln_unary(g, "relu", kiln_binary(g, "add", x, kiln_scalar(g, 1)));
    kiln_output(g, kiln_reduce(g, "sum", r, 1, &d, 0), "y");
    Plan *p = compile(g);
    CHECK(p);
    Schedule *s = p->sched;
    CHECK(s->nnodes == 1 && s->nodes[0].body == BODY_REDUCTION);
    CHECK(s->nodes[0].numel == N && s->nodes[0].rnumel == N);
    static const char *const calls[] = {"cpp_fused_add_relu_sum_0"};
    CHECK(calls_are(s, 1, calls) && s->kernels[0].loop_nests == 1);
    EXPECT(s->unfused_bytes == 5 * F4 * NN + F4 * N, "unfused %lld", (long long)s->unfused_bytes);
    EXPECT(s->fused_bytes == F4 * NN + F4 * N, "fused %lld", (long long)s->fused_bytes);
    plan_free(p);
}

/* siblings amax(x,1), sum(x,1): horizontal fusion, x read once. */
TEST(sched_siblings) {
    kiln_graph *g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 2, SQ), d = 1;
    kiln_output(g, kiln_reduce(g, "amax", x, 1, &d, 0), "m");
    kiln_output(g, kiln_reduce(g, "sum", x, 1, &d, 0), "s");
    Plan *p = compile(g);
    CHECK(p);
    Schedule *s = p->sched;
    CHECK(s->nnodes == 2 && s->rounds[0].possible == 1);
    CHECK(s->rounds[0].nfused == 1 && fused(s, 1, 0, "op0", "op1"));
    static const char *const calls[] = {"cpp_fused_amax_sum_0"};
    CHECK(calls_are(s, 1, calls));
    const Kernel *k = &s->kernels[0];
    CHECK(k->loop_nests == 1 && k->nstages == 1 && k->kind == KK_REDUCTION);
    EXPECT(k->load_bytes == F4 * NN, "x read once: %lld", (long long)k->load_bytes);
    EXPECT(s->unfused_bytes == 2 * (F4 * NN + F4 * N), "unfused");
    EXPECT(s->fused_bytes == F4 * NN + 2 * F4 * N, "fused %lld", (long long)s->fused_bytes);
    plan_free(p);
}

/* unrelated siblings amax(x,1), sum(y,1): nothing shared, nothing to fuse. */
TEST(sched_unrelated_siblings) {
    kiln_graph *g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 2, SQ), y = kiln_input(g, "y", KILN_F32, 2, SQ), d = 1;
    kiln_output(g, kiln_reduce(g, "amax", x, 1, &d, 0), "m");
    kiln_output(g, kiln_reduce(g, "sum", y, 1, &d, 0), "s");
    Plan *p = compile(g);
    CHECK(p);
    Schedule *s = p->sched;
    CHECK(s->nnodes == 2 && s->nrounds == 1 && s->rounds[0].possible == 0);
    static const char *const calls[] = {"cpp_fused_amax_0", "cpp_fused_sum_1"};
    CHECK(calls_are(s, 2, calls));
    EXPECT(!strcmp(sched_why_not(s, "op0", "op1"), "no shared data"), "why");
    plan_free(p);
}

/* wall relu(x - mean(x)): the whole-tensor reduction blocks fusion. */
TEST(sched_wall) {
    kiln_graph *g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 2, SQ);
    int m = kiln_reduce(g, "mean", x, 0, NULL, 0);
    kiln_output(g, kiln_unary(g, "relu", kiln_binary(g, "sub", x, m)), "y");
    Plan *p = compile(g);
    CHECK(p);
    Schedule *s = p->sched;
    CHECK(s->nnodes == 2 && s->nodes[0].body == BODY_REDUCTION &&
          s->nodes[1].body == BODY_POINTWISE);
    CHECK(s->nodes[0].numel == 1 && s->nodes[0].rnumel == NN);
    CHECK(s->nrounds == 1 && s->rounds[0].possible == 0);
    CHECK(was_rejected(s, "op0", "op1", "whole-tensor reduction"));
    static const char *const calls[] = {"cpp_fused_mean_0", "cpp_fused_mean_relu_sub_1"};
    CHECK(calls_are(s, 2, calls));
    /* unfused: sum x->1, mul by 1/n, sub reads x and the scalar, relu */
    EXPECT(s->unfused_bytes == 5 * F4 * NN + 4 * F4, "unfused %lld", (long long)s->unfused_bytes);
    EXPECT(s->fused_bytes == 3 * F4 * NN + 2 * F4, "fused %lld", (long long)s->fused_bytes);
    plan_free(p);
}

/* wall with a shared chain: t = relu(x*2+1); y = relu(t - mean(t)) * 3.
 * Two kernels; t is recomputed in the second (its ops in both origins). */
TEST(sched_wall_shared_chain) {
    kiln_graph *g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 2, SQ);
    int t = kiln_unary(
        g, "relu",
        kiln_binary(g, "add", kiln_binary(g, "mul", x, kiln_scalar(g, 2)), kiln_scalar(g, 1)));
    int m = kiln_reduce(g, "mean", t, 0, NULL, 0);
    kiln_output(g,
                kiln_binary(g, "mul", kiln_unary(g, "relu", kiln_binary(g, "sub", t, m)),
                            kiln_scalar(g, 3)),
                "y");
    Plan *p = compile(g);
    CHECK(p);
    Schedule *s = p->sched;
    CHECK(s->nnodes == 2 && p->prog->ncomputed == 2); /* no buffer for t */
    CHECK(s->rounds[0].possible == 0);
    static const char *const calls[] = {"cpp_fused_add_mean_mul_relu_0",
                                        "cpp_fused_add_mean_mul_relu_sub_1"};
    CHECK(calls_are(s, 2, calls));
    /* unfused: mul add relu (2 each), sum (1 + scalar), mul 1/n (scalars),
     * sub (2 + scalar), relu (2), mul (2) */
    EXPECT(s->unfused_bytes == 13 * F4 * NN + 4 * F4, "unfused %lld", (long long)s->unfused_bytes);
    EXPECT(s->fused_bytes == 3 * F4 * NN + 2 * F4, "fused %lld", (long long)s->fused_bytes);
    plan_free(p);
}

/* softmax: 4 nodes (amax, exp, sum, div), two rounds into one kernel whose
 * single row loop holds three inner loops; the fusion log the softmax seed
 * experiment expects. */
TEST(sched_softmax) {
    kiln_graph *g = kiln_graph_new();
    kiln_output(g, kiln_softmax(g, kiln_input(g, "x", KILN_F32, 2, SQ), 1), "y");
    Plan *p = compile(g);
    CHECK(p);
    Schedule *s = p->sched;
    CHECK(s->nnodes == 4 && s->nrounds == 2);
    CHECK(was_rejected(s, "op1", "op3", "intermediate nodes between node1 & node2"));
    CHECK(s->rounds[0].possible == 1 && s->rounds[0].nfused == 1 && fused(s, 1, 0, "op1", "op2"));
    CHECK(s->rounds[0].nodes_after == 3);
    CHECK(s->rounds[1].nfused == 2 && fused(s, 2, 0, "op0", "op1_op2") &&
          fused(s, 2, 1, "op0_op1_op2", "op3"));
    static const char *const calls[] = {"cpp_fused_softmax_0"};
    CHECK(calls_are(s, 1, calls));
    const Kernel *k = &s->kernels[0];
    CHECK(k->loop_nests == 1 && k->kind == KK_REDUCTION && k->nstages == 3);
    for (int i = 0; i < 3; i++) EXPECT(k->store[i] == STORE_ROW_LOCAL, "member %d local", i);
    EXPECT(k->store[3] == STORE_GLOBAL, "output stored");
    EXPECT(k->stage[0] == 0 && k->stage[1] == 1 && k->stage[2] == 1 && k->stage[3] == 2, "stages");
    EXPECT(s->unfused_bytes == 8 * F4 * NN + 4 * F4 * N, "unfused %lld",
           (long long)s->unfused_bytes);
    EXPECT(s->fused_bytes == 2 * F4 * NN, "fused %lld", (long long)s->fused_bytes);
    plan_free(p);
}

/* extern relu((x+1) @ w) as Inductor schedules it (extern epilogues off):
 * the matmul is a wall on both sides. test_epilogue.c has the default. */
TEST(sched_extern) {
    static const int64_t xs[2] = {64, 32}, ws[2] = {32, 16};
    const int64_t M = 64, K = 32, Nc = 16;
    kiln_graph *g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 2, xs), w = kiln_input(g, "w", KILN_F32, 2, ws);
    kiln_output(
        g, kiln_unary(g, "relu", kiln_matmul(g, kiln_binary(g, "add", x, kiln_scalar(g, 1)), w)),
        "y");
    KilnConfig c = quiet();
    c.extern_epilogue = false;
    Plan *p = compile_cfg(g, &c);
    CHECK(p);
    Schedule *s = p->sched;
    CHECK(s->nnodes == 3 && s->rounds[0].possible == 0);
    CHECK(was_rejected(s, "op0", "op1", "node2 is extern"));
    CHECK(was_rejected(s, "op1", "op2", "node1 is extern"));
    static const char *const calls[] = {"cpp_fused_add_0", "extern_kernels.mm", "cpp_fused_relu_1"};
    CHECK(calls_are(s, 3, calls));
    EXPECT(s->kernels[1].kind == KK_EXTERN && s->kernels[1].loop_nests == 0, "extern");
    int64_t want = 2 * F4 * M * K + F4 * (M * K + K * Nc + M * Nc) + 2 * F4 * M * Nc;
    EXPECT(s->unfused_bytes == want && s->fused_bytes == want, "traffic %lld %lld want %lld",
           (long long)s->unfused_bytes, (long long)s->fused_bytes, (long long)want);
    plan_free(p);
}

/* A batched matmul whose weight every batch shares runs as one GEMM
 * (ext_matmul's batch folding) and is named mm, as what runs; batches with
 * their own B, and a shared B whose A rows are not evenly spaced (a
 * transposed batch), stay bmm. */
TEST(sched_folded_batch_named_mm) {
    static const int64_t xs[3] = {128, 1, 256}, ws[2] = {256, 768};
    static const int64_t as[3] = {4, 8, 16}, bs[3] = {4, 16, 5}, ts[3] = {8, 4, 16};
    static const int64_t vs[2] = {16, 5};
    kiln_graph *g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 3, xs), w = kiln_input(g, "w", KILN_F32, 2, ws);
    int a = kiln_input(g, "a", KILN_F32, 3, as), b = kiln_input(g, "b", KILN_F32, 3, bs);
    int t = kiln_input(g, "t", KILN_F32, 3, ts), v = kiln_input(g, "v", KILN_F32, 2, vs);
    static const int perm[3] = {1, 0, 2};
    kiln_output(g, kiln_matmul(g, x, w), "y"); /* [128, 1, 768]: one GEMM of 128 rows */
    kiln_output(g, kiln_matmul(g, a, b), "z"); /* four B matrices */
    /* [4, 8, 16] with rows 64 apart inside a batch but batches 16 apart */
    kiln_output(g, kiln_matmul(g, kiln_permute(g, t, 3, perm), v), "u");
    Plan *p = compile(g);
    CHECK(p);
    static const char *const calls[] = {"extern_kernels.mm", "extern_kernels.bmm",
                                        "extern_kernels.bmm"};
    CHECK(calls_are(p->sched, 3, calls));
    plan_free(p);
}

/* layout sum(x,1), sum(x,0): different index formulas over x, no shared data. */
TEST(sched_layout) {
    static const int64_t xs[2] = {64, 128};
    kiln_graph *g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 2, xs), d1 = 1, d0 = 0;
    kiln_output(g, kiln_reduce(g, "sum", x, 1, &d1, 0), "a");
    kiln_output(g, kiln_reduce(g, "sum", x, 1, &d0, 0), "b");
    Plan *p = compile(g);
    CHECK(p);
    Schedule *s = p->sched;
    CHECK(s->nnodes == 2 && s->rounds[0].possible == 0);
    CHECK(was_rejected(s, "op0", "op1", "no shared data"));
    CHECK(s->nkernels == 2);
    EXPECT(!strcmp(s->nodes[0].deps[0].ix, "128*v0 + v1"), "%s", s->nodes[0].deps[0].ix);
    EXPECT(!strcmp(s->nodes[1].deps[0].ix, "v0 + 128*v1"), "%s", s->nodes[1].deps[0].ix);
    plan_free(p);
}

/* A long chain where every intermediate is an output: groups of at most 64. */
TEST(sched_long_chain_max_fusion) {
    static const int64_t xs[1] = {256};
    const int ops = 100;
    kiln_graph *g = kiln_graph_new();
    int v = kiln_input(g, "x", KILN_F32, 1, xs);
    for (int i = 0; i < ops; i++) {
        char name[16];
        v = kiln_binary(g, i % 2 ? "mul" : "add", v, kiln_scalar(g, 1 + i % 3));
        snprintf(name, sizeof name, "t%d", i);
        kiln_output(g, v, name);
    }
    Plan *p = compile(g);
    CHECK(p);
    Schedule *s = p->sched;
    CHECK(s->nnodes == ops);
    CHECK(count_rejected(s, "exceeds max fusion") > 0);
    CHECK(s->nkernels == 2 && s->kernels[0].n == 64 && s->kernels[1].n == 36);
    for (int i = 0; i < s->nkernels; i++) EXPECT(s->kernels[i].n <= 64, "kernel %d", i);
    EXPECT(s->unfused_bytes == 2 * ops * F4 * 256, "unfused");
    /* kernel 1 loads x and stores 64 outputs; kernel 2 loads t63, stores 36 */
    EXPECT(s->fused_bytes == (1 + 64 + 1 + 36) * F4 * 256, "fused %lld", (long long)s->fused_bytes);
    plan_free(p);
}

/* dropout used twice: the random value is one node, computed once. */
TEST(sched_dropout_twice) {
    static const int64_t xs[2] = {64, 64};
    kiln_graph *g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 2, xs);
    int d = kiln_dropout(g, x, 0.25, 7);
    kiln_output(g, kiln_binary(g, "add", d, kiln_scalar(g, 1)), "a");
    kiln_output(g, kiln_binary(g, "mul", d, kiln_scalar(g, 2)), "b");
    Plan *p = compile(g);
    CHECK(p);
    Schedule *s = p->sched;
    CHECK(s->nnodes == 3 && s->nodes[0].body == BODY_RAND);
    int holders = 0;
    for (int k = 0; k < s->nkernels; k++)
        for (int i = 0; i < s->kernels[k].n; i++) holders += s->kernels[k].members[i] == 0;
    EXPECT(holders == 1, "rand in %d kernels", holders);
    CHECK(s->nkernels == 1);
    EXPECT(s->kernels[0].store[0] == STORE_REGISTER, "rand stays in a register");
    /* the rand is never an expression: every body only loads it */
    for (int b = 0; b < p->prog->nbufs; b++)
        EXPECT(p->prog->bufs[b]->body != BODY_RAND || b == s->nodes[0].buf, "one rand buffer");
    plan_free(p);
}

/* ---- more programs that must end as one kernel, or two --------------------------- */

TEST(sched_layer_norm_one_kernel) {
    static const int64_t ns[1] = {N};
    kiln_graph *g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 2, SQ);
    int w = kiln_input(g, "w", KILN_F32, 1, ns), b = kiln_input(g, "b", KILN_F32, 1, ns);
    kiln_output(g, kiln_layer_norm(g, x, 1, ns, w, b, 1e-5), "y");
    Plan *p = compile(g);
    CHECK(p);
    Schedule *s = p->sched;
    CHECK(s->nnodes == 3); /* sum(x), sum((x - mean)^2), the normalized output */
    static const char *const calls[] = {"cpp_fused_layer_norm_0"};
    CHECK(calls_are(s, 1, calls) && s->kernels[0].loop_nests == 1);
    CHECK(s->kernels[0].nstages == 3);
    EXPECT(s->fused_bytes == 2 * F4 * NN + 2 * F4 * N, "fused %lld", (long long)s->fused_bytes);
    plan_free(p);
}

TEST(sched_gelu_bias_one_kernel) {
    static const int64_t ns[1] = {N};
    kiln_graph *g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 2, SQ), b = kiln_input(g, "b", KILN_F32, 1, ns);
    kiln_output(g, kiln_unary(g, "gelu", kiln_binary(g, "add", x, b)), "y");
    Plan *p = compile(g);
    CHECK(p);
    CHECK(p->sched->nnodes == 1 && p->sched->nkernels == 1);
    EXPECT(p->sched->fused_bytes == 2 * F4 * NN + F4 * N, "fused %lld",
           (long long)p->sched->fused_bytes);
    plan_free(p);
}

TEST(sched_residual_one_kernel) {
    kiln_graph *g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 2, SQ);
    int h = kiln_binary(g, "add", kiln_binary(g, "mul", x, kiln_scalar(g, 2)), kiln_scalar(g, 1));
    kiln_output(g, kiln_unary(g, "relu", kiln_binary(g, "add", h, x)), "y");
    Plan *p = compile(g);
    CHECK(p);
    static const char *const calls[] = {"cpp_fused_add_mul_relu_0"};
    CHECK(p->sched->nnodes == 1 && calls_are(p->sched, 1, calls));
    EXPECT(p->sched->fused_bytes == 2 * F4 * NN, "x is loaded once");
    plan_free(p);
}

/* variance over the whole tensor: the second reduction needs the first's
 * complete result; its scaling by 1/n is a per-row (scalar) step after it. */
TEST(sched_whole_tensor_reduction_consumer) {
    kiln_graph *g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 2, SQ);
    int d = kiln_binary(g, "sub", x, kiln_reduce(g, "mean", x, 0, NULL, 0));
    kiln_output(g, kiln_reduce(g, "mean", kiln_binary(g, "mul", d, d), 0, NULL, 0), "var");
    Plan *p = compile(g);
    CHECK(p);
    Schedule *s = p->sched;
    CHECK(s->nnodes == 3);
    CHECK(was_rejected(s, "op0", "op1",
                       "whole-tensor reduction: consumer needs the complete result"));
    CHECK(s->nkernels == 2 && s->kernels[0].n == 1 && s->kernels[1].n == 2);
    EXPECT(s->kernels[1].nstages == 2 && s->kernels[1].stage_kind[1] == STAGE_ROW, "row step");
    plan_free(p);
}

/* ---- each can_fuse rule in isolation ------------------------------------------------ */

/* s = sum(x, 1); y = x / s: op1 reads op0. */
static Plan *row_consumer(void) {
    static const int64_t xs[2] = {32, 64};
    kiln_graph *g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 2, xs), d = 1;
    int sm = kiln_reduce(g, "sum", x, 1, &d, 1);
    kiln_output(g, sm, "s");
    kiln_output(g, kiln_binary(g, "div", x, sm), "y");
    return compile(g);
}

/* With extern epilogues off (Inductor) an extern is a wall both ways; on
 * (the default) it still never is node2, but may take its consumer. */
TEST(sched_rule_extern) {
    static const int64_t xs[2] = {8, 8};
    for (int on = 0; on < 2; on++) {
        kiln_graph *g = kiln_graph_new();
        int x = kiln_input(g, "x", KILN_F32, 2, xs);
        kiln_output(g, kiln_unary(g, "relu", kiln_matmul(g, kiln_unary(g, "exp", x), x)), "y");
        KilnConfig c = quiet();
        c.extern_epilogue = on;
        Plan *p = compile_cfg(g, &c);
        CHECK(p);
        const char *why = sched_why_not(p->sched, "op1", "op2");
        EXPECT(!strcmp(sched_why_not(p->sched, "op0", "op1"), "node2 is extern"), "node2");
        EXPECT(on ? why == NULL : why && !strcmp(why, "node1 is extern"), "node1 (on %d): %s", on,
               why ? why : "fusible");
        plan_free(p);
    }
}

TEST(sched_rule_order) {
    Plan *p = row_consumer();
    CHECK(p);
    EXPECT(sched_why_not(p->sched, "op0", "op1") == NULL, "fusible as given");
    EXPECT(!strcmp(sched_why_not(p->sched, "op1", "op0"), "node1 must go before node2"), "order");
    plan_free(p);
}

TEST(sched_rule_device) {
    Plan *p = row_consumer();
    CHECK(p);
    p->sched->nodes[1].device = 1;
    const char *why = sched_why_not(p->sched, "op0", "op1");
    p->sched->nodes[1].device = 0;
    EXPECT(why && !strcmp(why, "device mismatch"), "%s", why ? why : "(null)");
    plan_free(p);
}

TEST(sched_rule_max_fusion) {
    KilnConfig c = quiet();
    c.max_fusion_size = 1;
    kiln_graph *g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 2, SQ), d = 1;
    kiln_output(g, kiln_reduce(g, "amax", x, 1, &d, 0), "m");
    kiln_output(g, kiln_reduce(g, "sum", x, 1, &d, 0), "s");
    Plan *p = compile_cfg(g, &c);
    CHECK(p);
    CHECK(was_rejected(p->sched, "op0", "op1", "exceeds max fusion") && p->sched->nkernels == 2);
    plan_free(p);
}

/* y = relu(x); z = transpose(y) + x: z reads y where y did not write it. */
TEST(sched_rule_memory_deps) {
    static const int64_t xs[2] = {64, 64};
    kiln_graph *g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 2, xs);
    int y = kiln_unary(g, "relu", x);
    kiln_output(g, y, "y");
    kiln_output(g, kiln_binary(g, "add", kiln_transpose(g, y, 0, 1), x), "z");
    Plan *p = compile(g);
    CHECK(p);
    CHECK(was_rejected(p->sched, "op0", "op1", "memory deps did not match"));
    CHECK(p->sched->nkernels == 2);
    plan_free(p);
}

/* a = amax(x,1); u = exp(y) read twice; b = exp(x) read twice, late:
 * fusing a with b would keep b alive alongside u. */
TEST(sched_rule_peak_memory) {
    kiln_graph *g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 2, SQ), y = kiln_input(g, "y", KILN_F32, 2, SQ), d = 1;
    kiln_output(g, kiln_reduce(g, "amax", x, 1, &d, 0), "a");
    int u = kiln_unary(g, "exp", y);
    kiln_output(g, kiln_reduce(g, "sum", u, 1, &d, 0), "s1");
    kiln_output(g, kiln_reduce(g, "amax", u, 1, &d, 0), "s2");
    int b = kiln_unary(g, "exp", x);
    kiln_output(g, kiln_reduce(g, "sum", b, 1, &d, 0), "c1");
    kiln_output(g, kiln_reduce(g, "amin", b, 1, &d, 0), "c2");
    Plan *p = compile(g);
    CHECK(p);
    CHECK(p->sched->nnodes == 7);
    CHECK(was_rejected(p->sched, "op0", "op4", "will increase peak memory"));
    EXPECT(!strcmp(sched_why_not(p->sched, "op0", "op4"), "will increase peak memory"), "why");
    plan_free(p);
}

/* a = exp(x) (an output); s = sum(a, 1); b = x * s: b depends on a only
 * through s, so a fused a+b would run both before and after s. */
TEST(sched_rule_cycle) {
    static const int64_t xs[2] = {32, 64};
    kiln_graph *g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 2, xs), d = 1;
    int a = kiln_unary(g, "exp", x);
    kiln_output(g, a, "a");
    kiln_output(g, kiln_binary(g, "mul", x, kiln_reduce(g, "sum", a, 1, &d, 1)), "b");
    Plan *p = compile(g);
    CHECK(p);
    CHECK(was_rejected(p->sched, "op0", "op2", "will create cycle"));
    plan_free(p);
}

/* r = sum(x, 1, keepdim); y = expand(r, [32, 7]) + 1: y shares r's row loop
 * but iterates [32, 7], neither the rows nor rows x reduced dims. */
TEST(sched_rule_loop_mismatch) {
    static const int64_t xs[2] = {32, 64}, es[2] = {32, 7};
    kiln_graph *g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 2, xs), d = 1;
    int r = kiln_reduce(g, "sum", x, 1, &d, 1);
    kiln_output(g, r, "r");
    kiln_output(g, kiln_binary(g, "add", kiln_expand(g, r, 2, es), kiln_scalar(g, 1)), "y");
    Plan *p = compile(g);
    CHECK(p);
    CHECK(was_rejected(p->sched, "op0", "op1",
                       "loop structure mismatch: reduction [32] x [64] vs pointwise [32, 7]"));
    plan_free(p);
}

TEST(sched_rule_register_pressure) {
    KilnConfig c = quiet();
    c.vector_registers = 2;
    kiln_graph *g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 2, SQ), d = 1;
    kiln_output(g, kiln_reduce(g, "amax", x, 1, &d, 0), "m");
    kiln_output(g, kiln_reduce(g, "sum", x, 1, &d, 0), "s");
    Plan *p = compile_cfg(g, &c);
    CHECK(p);
    CHECK(was_rejected(p->sched, "op0", "op1", "register pressure: 3 live values > budget 2"));
    CHECK(p->sched->nkernels == 2);
    plan_free(p);
}

/* 40 sibling reductions of x: accumulators pile up; fusion stops at the
 * register budget (sum(x + c) needs 2, x stays loaded, one accumulator each). */
TEST(sched_many_siblings_register_budget) {
    static const int64_t xs[2] = {64, 64};
    kiln_graph *g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 2, xs), d = 1;
    for (int i = 0; i < 40; i++) {
        char name[16];
        snprintf(name, sizeof name, "s%d", i);
        kiln_output(g, kiln_reduce(g, "sum", kiln_binary(g, "add", x, kiln_scalar(g, i)), 1, &d, 0),
                    name);
    }
    Plan *p = compile(g);
    CHECK(p);
    Schedule *s = p->sched;
    CHECK(count_rejected(s, "register pressure") > 0);
    for (int k = 0; k < s->nkernels; k++)
        EXPECT(s->kernels[k].regs <= 32, "kernel %d: %d", k, s->kernels[k].regs);
    EXPECT(s->nkernels == 2 && s->kernels[0].n == 29, "kernels %d, first %d", s->nkernels,
           s->kernels[0].n);
    plan_free(p);
}

/* ---- stability and reports -------------------------------------------------------- */

static kiln_graph *mixed(void) {
    static const int64_t ns[1] = {N};
    kiln_graph *g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 2, SQ), w = kiln_input(g, "w", KILN_F32, 2, SQ);
    int b = kiln_input(g, "b", KILN_F32, 1, ns);
    int h = kiln_layer_norm(g, kiln_softmax(g, x, 1), 1, ns, KILN_NONE, b, 1e-5);
    kiln_output(g, kiln_unary(g, "relu", kiln_matmul(g, h, w)), "y");
    kiln_output(g, chain(g, h), "z");
    return g;
}

static char *explain_text(Plan *p) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    report_explain(f, p->sched);
    report_json(f, p->sched, NULL);
    fclose(f);
    return text;
}

TEST(sched_decisions_stable) {
    Plan *a = compile(mixed()), *b = compile(mixed());
    CHECK(a && b);
    CHECK(a->sched->nkernels == b->sched->nkernels && a->sched->nrejected == b->sched->nrejected);
    for (int i = 0; i < a->sched->nkernels; i++) {
        EXPECT(!strcmp(a->sched->kernels[i].kernel, b->sched->kernels[i].kernel), "kernel %d", i);
        EXPECT(!strcmp(a->sched->kernels[i].name, b->sched->kernels[i].name), "nodes %d", i);
    }
    char *ta = explain_text(a), *tb = explain_text(b);
    EXPECT(!strcmp(ta, tb), "explain differs");
    free(ta);
    free(tb);
    plan_free(a);
    plan_free(b);
}

static void extra_json(FILE *f, void *ud) {
    (void)ud;
    fprintf(f, ", \"check\": {\"passed\": true, \"max_abs_error\": 0.0}");
}

TEST(sched_reports) {
    Plan *p = compile(mixed());
    CHECK(p);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ReportHooks h = {extra_json, NULL};
    report_json(f, p->sched, &h);
    fclose(f);
    static const char *const keys[] = {
        "\"kernels\"",    "\"calls\"",   "\"fusion\"",        "\"nodes_before\"",      "\"rounds\"",
        "\"rejected\"",   "\"traffic\"", "\"unfused_bytes\"", "\"peak_memory_bytes\"", "\"check\"",
        "\"loop_nests\"", "\"origins\""};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        EXPECT(strstr(text, keys[i]), "json lacks %s", keys[i]);
    free(text);
    f = open_memstream(&text, &len);
    report_dot(f, p->sched);
    fclose(f);
    EXPECT(!strncmp(text, "digraph kiln {", 14) && strstr(text, "extern_kernels.mm"), "dot");
    free(text);
    PlanSummary sum;
    sched_summary(p->sched, &sum);
    EXPECT(sum.nextern == 1 && sum.nkernels == p->sched->nkernels && sum.fused_bytes > 0,
           "summary");
    plan_free(p);
}

/* KILN_LOGS=fusion prints Inductor's log lines (docs/design.md, "Reports"). */
TEST(sched_fusion_log_format) {
    KilnConfig c = quiet();
    char *text = NULL;
    size_t len = 0;
    c.log = open_memstream(&text, &len);
    c.logs = LOG_FUSION | LOG_SCHEDULE;
    kiln_graph *g = kiln_graph_new();
    kiln_output(g, kiln_softmax(g, kiln_input(g, "x", KILN_F32, 2, SQ), 1), "y");
    Plan *p = compile_cfg(g, &c);
    fclose(c.log);
    CHECK(p);
    static const char *const lines[] = {
        "SchedulerNode(name='op0'), Reduction(['[1024]', 'max', 'origins=[softmax]'])\n",
        "cannot fuse op1 with op3: intermediate nodes between node1 & node2\n",
        "found 1 possible fusions\nfusing op1 with op2\n"
        "completed fusion round (1/10): fused 4 nodes into 3 nodes\n",
        "fusing op0 with op1_op2\nfusing op0_op1_op2 with op3\n"
        "completed fusion round (2/10): fused 3 nodes into 1 nodes\n",
    };
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++)
        EXPECT(strstr(text, lines[i]), "log lacks: %s", lines[i]);
    free(text);
    plan_free(p);
}

/* ---- out of memory: every allocation in turn fails; nothing leaks or crashes ---- */

static struct { long count, fail_at; } oom;

static void *failing_alloc(void *ud, void *ptr, size_t old, size_t n) {
    (void)ud;
    (void)old;
    if (n == 0) {
        free(ptr);
        return NULL;
    }
    if (++oom.count == oom.fail_at) return NULL;
    return realloc(ptr, n);
}

TEST(sched_out_of_memory) {
    kiln_graph *g = mixed();
    KilnConfig c = quiet();
    int failures = 0;
    for (long n = 1; n < 100000; n++) {
        oom.count = 0;
        oom.fail_at = n;
        kiln_set_allocator(failing_alloc, NULL);
        Plan *p = NULL;
        char err[256];
        kiln_status st = plan_build(g, &c, &p, err, sizeof err);
        kiln_set_allocator(NULL, NULL);
        if (st == KILN_OK) { /* some module may tolerate a failure */
            plan_free(p);
            if (oom.count < n) break; /* nothing failed: every allocation was tried */
            continue;
        }
        failures++;
        EXPECT(st == KILN_ERR_NOMEM && p == NULL, "allocation %ld: status %d (%s)", n, st, err);
        if (test_failed) break;
    }
    EXPECT(failures > 10, "only %d allocations", failures);
    if (getenv("KILN_TEST_VERBOSE")) printf("  %d allocation failures tried\n", failures);
    kiln_graph_free(g);
}
