/*
 * test_rewrite.c -- Conv-BN folding (src/graph/rewrite.c, applied by dec_run).
 *
 * The oracle: the same Conv-BN(-ReLU) program built twice on the same data,
 * once with every parameter a `weight` (folded at compile time) and once
 * with BN's parameters as runtime inputs (never folded: BN decomposes into
 * the pointwise ops the interpreter runs one by one). Both go through the
 * reference interpreter and must agree within 1e-4 relative. The decomposed
 * graph from dec_run then shows whether the fold happened: one CONV2D, no
 * pointwise op but the relu, or BN's ops still there and a note saying why.
 */
#include "test.h"
#include "graph/graph.h"
#include "runtime/runtime.h" /* plan_build */

/* One Conv-BN variant. */
typedef struct {
    const char *what;
    int64_t n, c, h, w, o, kh, kw;
    int stride, pad, dil, groups;
    bool conv_bias, gamma, beta, relu;
} ConvBn;

/* Where each parameter lives. */
enum {
    P_CONV_W = 1 << 0,
    P_CONV_B = 1 << 1,
    P_MEAN = 1 << 2,
    P_VAR = 1 << 3,
    P_GAMMA = 1 << 4,
    P_BETA = 1 << 5,
    P_BN = P_MEAN | P_VAR | P_GAMMA | P_BETA,
};

#define MAXP 7 /* x and six parameters */

/* Inputs of a built program, in declaration order (x first). */
typedef struct {
    int n;
    kiln_tensor t[MAXP];
} Bound;

typedef struct {
    float *data[MAXP]; /* x, w, b, mean, var, gamma, beta */
    int64_t numel[MAXP];
} Data;

static void make_data(const ConvBn *c, Data *d, uint64_t seed) {
    int64_t cg = c->c / c->groups;
    d->numel[0] = c->n * c->c * c->h * c->w;
    d->numel[1] = c->o * cg * c->kh * c->kw;
    for (int k = 2; k < MAXP; k++) d->numel[k] = c->o;
    for (int k = 0; k < MAXP; k++) {
        d->data[k] = malloc(sizeof(float) * (size_t)d->numel[k]);
        kiln_fill_randn(d->data[k], d->numel[k], seed + (uint64_t)k);
    }
    kiln_fill_rand(d->data[4], c->o, seed + 99); /* var in [0.25, 1.25) */
    for (int64_t i = 0; i < c->o; i++) d->data[4][i] += 0.25f;
}

static void free_data(Data *d) {
    for (int k = 0; k < MAXP; k++) free(d->data[k]);
}

/* A parameter as a weight (bit set in consts) or as an input bound to data. */
static kiln_value param(kiln_graph *g, Bound *b, const char *name, int rank, const int64_t *shape,
                        const float *data, bool constant) {
    if (constant) return kiln_weight(g, name, rank, shape, data);
    kiln_tensor *t = &b->t[b->n++];
    memset(t, 0, sizeof *t);
    t->dtype = KILN_F32;
    t->rank = rank;
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)rank);
    t->data = (void *)data;
    return kiln_input(g, name, KILN_F32, rank, shape);
}

/* Build the program; conv is set to the conv2d value. */
static kiln_graph *build(const ConvBn *c, const Data *d, unsigned consts, Bound *b,
                         kiln_value *conv) {
    kiln_graph *g = kiln_graph_new();
    int64_t xs[4] = {c->n, c->c, c->h, c->w}, ws[4] = {c->o, c->c / c->groups, c->kh, c->kw};
    int64_t os[1] = {c->o};
    b->n = 0;
    kiln_value x = param(g, b, "x", 4, xs, d->data[0], false);
    kiln_value w = param(g, b, "w", 4, ws, d->data[1], consts & P_CONV_W);
    kiln_value bias =
        c->conv_bias ? param(g, b, "b", 1, os, d->data[2], consts & P_CONV_B) : KILN_NONE;
    kiln_value mean = param(g, b, "mean", 1, os, d->data[3], consts & P_MEAN);
    kiln_value var = param(g, b, "var", 1, os, d->data[4], consts & P_VAR);
    kiln_value gamma =
        c->gamma ? param(g, b, "gamma", 1, os, d->data[5], consts & P_GAMMA) : KILN_NONE;
    kiln_value beta = c->beta ? param(g, b, "beta", 1, os, d->data[6], consts & P_BETA) : KILN_NONE;
    kiln_conv_params p = {{c->stride, c->stride}, {c->pad, c->pad}, {c->dil, c->dil}, c->groups};
    *conv = kiln_conv2d(g, x, w, bias, &p);
    kiln_value y = kiln_batch_norm(g, *conv, mean, var, gamma, beta, 1e-5);
    if (c->relu) y = kiln_unary(g, "relu", y);
    kiln_output(g, y, "y");
    return g;
}

/* |a - b| <= 1e-4 (|b| + 1) everywhere; the first mismatch is reported. */
static bool close_all(const kiln_tensor *a, const kiln_tensor *b, const char *what) {
    int64_t n = kiln_tensor_numel(b);
    if (kiln_tensor_numel(a) != n) {
        test_failf(__FILE__, __LINE__, "%s: %lld vs %lld elements", what,
                   (long long)kiln_tensor_numel(a), (long long)n);
        return false;
    }
    const float *pa = a->data, *pb = b->data;
    for (int64_t i = 0; i < n; i++)
        if (!(fabsf(pa[i] - pb[i]) <= 1e-4f * (fabsf(pb[i]) + 1.0f))) {
            test_failf(__FILE__, __LINE__, "%s: element %lld: %g vs %g", what, (long long)i, pa[i],
                       pb[i]);
            return false;
        }
    return true;
}

/* The decomposed graph (caller frees). */
static kiln_graph *decomposed(kiln_graph *g) {
    kiln_graph *d = kiln_graph_new();
    if (dec_run(g, d) != KILN_OK) test_failf(__FILE__, __LINE__, "dec_run: %s", kiln_error(d));
    return d;
}

static int count_op(const kiln_graph *g, Op op) {
    int n = 0;
    for (int i = 0; i < g->n; i++) n += g->nodes[i].op == op;
    return n;
}

static int count_kind(const kiln_graph *g, OpKind k) {
    int n = 0;
    for (int i = 0; i < g->n; i++) n += op_info[g->nodes[i].op].kind == k;
    return n;
}

static bool has_note(const kiln_graph *g, const char *text) {
    for (const GraphNote *n = g->notes; n; n = n->next)
        if (strstr(n->text, text)) return true;
    return false;
}

/* The fold happened: one conv whose direct consumer is the output (or relu),
 * no pointwise op between them, no BN parameter left in the graph. */
static bool is_folded(const kiln_graph *d, const ConvBn *c) {
    int out = d->outputs[0];
    const Node *y = &d->nodes[out];
    int conv = c->relu ? (y->op == OP_RELU ? y->in[0] : -1) : out;
    return count_op(d, OP_CONV2D) == 1 && conv >= 0 && d->nodes[conv].op == OP_CONV2D &&
           count_kind(d, KIND_POINTWISE) == (c->relu ? 1 : 0) && count_op(d, OP_BATCH_NORM) == 0 &&
           count_op(d, OP_WEIGHT) == 2 && has_note(d, "folded batch_norm into conv2d");
}

static const ConvBn variants[] = {
    {"3x3 pad 1, bias, affine, relu", 2, 3, 8, 7, 5, 3, 3, 1, 1, 1, 1, true, true, true, true},
    {"3x3 no bias, affine, relu", 1, 4, 9, 9, 6, 3, 3, 1, 1, 1, 1, false, true, true, true},
    {"1x1, no affine, no relu", 2, 6, 5, 5, 4, 1, 1, 1, 0, 1, 1, false, false, false, false},
    {"7x7 stride 2 pad 3, gamma only", 1, 3, 16, 16, 8, 7, 7, 2, 3, 1, 1, true, true, false, true},
    {"stride 2 no pad, beta only", 2, 2, 9, 9, 3, 3, 3, 2, 0, 1, 1, false, false, true, true},
    {"dilation 2", 1, 2, 10, 10, 3, 3, 3, 1, 2, 2, 1, true, true, true, true},
    {"groups 2", 2, 4, 6, 6, 6, 3, 3, 1, 1, 1, 2, true, true, true, true},
    {"depthwise", 1, 5, 7, 7, 5, 3, 3, 1, 1, 1, 5, false, true, true, true},
    {"depthwise x2 stride 2", 2, 3, 8, 8, 6, 5, 5, 2, 2, 1, 3, true, true, true, false},
};

TEST(rewrite_fold_matches_unfolded) {
    for (size_t v = 0; v < sizeof variants / sizeof *variants && !test_failed; v++) {
        const ConvBn *c = &variants[v];
        Data d;
        make_data(c, &d, 100 + v * 10);
        Bound bf, bu;
        kiln_value conv;
        kiln_graph *gf = build(c, &d, ~0u, &bf, &conv);
        kiln_graph *gu = build(c, &d, P_CONV_W | P_CONV_B, &bu, &conv);
        kiln_tensor of, ou;
        EXPECT(kiln_error(gf)[0] == 0 && kiln_error(gu)[0] == 0, "%s: build", c->what);
        EXPECT(kiln_interpret(gf, bf.t, &of) == KILN_OK, "%s: %s", c->what, kiln_error(gf));
        EXPECT(kiln_interpret(gu, bu.t, &ou) == KILN_OK, "%s: %s", c->what, kiln_error(gu));
        if (!test_failed) {
            close_all(&of, &ou, c->what);
            kiln_tensor_free(&of);
            kiln_tensor_free(&ou);
        }
        kiln_graph *df = decomposed(gf), *du = decomposed(gu);
        EXPECT(is_folded(df, c), "%s: not folded", c->what);
        EXPECT(!is_folded(du, c) && count_op(du, OP_RSQRT) == 1,
               "%s: folded with runtime parameters", c->what);
        EXPECT(has_note(du, "running_mean is not a compile-time constant"), "%s: note", c->what);
        kiln_graph_free(df);
        kiln_graph_free(du);
        kiln_graph_free(gf);
        kiln_graph_free(gu);
        free_data(&d);
    }
}

/* Each reason a fold is declined leaves BN's pointwise ops in the graph,
 * says why, and still computes the right values. */
TEST(rewrite_declined) {
    static const struct {
        unsigned consts;
        const char *why;
    } cases[] = {
        {~0u & ~P_CONV_W, "conv weight is not a compile-time constant"},
        {~0u & ~P_CONV_B, "conv bias is not a compile-time constant"},
        {~0u & ~P_MEAN, "running_mean is not"},
        {~0u & ~P_VAR, "running_var is not"},
        {~0u & ~P_GAMMA, "batch_norm's weight is not"},
        {~0u & ~P_BETA, "batch_norm's bias is not"},
    };
    const ConvBn *c = &variants[0];
    Data d;
    make_data(c, &d, 7);
    Bound b0, b;
    kiln_value conv;
    kiln_graph *g0 = build(c, &d, ~0u, &b0, &conv);
    kiln_tensor want;
    CHECKF(kiln_interpret(g0, b0.t, &want) == KILN_OK, "%s", kiln_error(g0));
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kiln_graph *g = build(c, &d, cases[i].consts, &b, &conv);
        kiln_graph *dg = decomposed(g);
        EXPECT(count_op(dg, OP_RSQRT) == 1 && !is_folded(dg, c), "case %zu folded", i);
        EXPECT(has_note(dg, cases[i].why), "case %zu: no note '%s'", i, cases[i].why);
        kiln_tensor got;
        EXPECT(kiln_interpret(g, b.t, &got) == KILN_OK, "%s", kiln_error(g));
        if (!test_failed) {
            close_all(&got, &want, cases[i].why);
            kiln_tensor_free(&got);
        }
        kiln_graph_free(dg);
        kiln_graph_free(g);
    }
    kiln_tensor_free(&want);
    kiln_graph_free(g0);
    free_data(&d);
}

/* The conv's unscaled output is needed elsewhere: no fold. */
TEST(rewrite_declined_conv_has_other_users) {
    const ConvBn *c = &variants[1];
    Data d;
    make_data(c, &d, 11);
    for (int variant = 0; variant < 2; variant++) {
        Bound b;
        kiln_value conv;
        kiln_graph *g = build(c, &d, ~0u, &b, &conv);
        if (variant == 0)
            kiln_output(g, kiln_binary(g, "mul", conv, kiln_scalar(g, 2)), "z");
        else
            kiln_output(g, conv, "c");
        kiln_graph *dg = decomposed(g);
        EXPECT(count_op(dg, OP_RSQRT) == 1 && count_op(dg, OP_CONV2D) == 1, "variant %d folded",
               variant);
        EXPECT(has_note(dg, variant ? "is a program output" : "has another user"), "variant %d: %s",
               variant, dg->notes ? dg->notes->text : "no note");
        kiln_graph_free(dg);
        kiln_graph_free(g);
    }
    free_data(&d);
}

/* var + eps <= 0 would make an infinite or NaN weight: left as written. */
TEST(rewrite_declined_nonfinite) {
    const ConvBn *c = &variants[2];
    Data d;
    make_data(c, &d, 12);
    d.data[4][1] = -1.0f;
    Bound b;
    kiln_value conv;
    kiln_graph *g = build(c, &d, ~0u, &b, &conv);
    kiln_graph *dg = decomposed(g);
    EXPECT(count_op(dg, OP_RSQRT) == 1, "folded a negative variance");
    EXPECT(has_note(dg, "would not be finite"), "no note");
    kiln_graph_free(dg);
    kiln_graph_free(g);
    free_data(&d);
}

/* Two convs share one weight, each followed by its own constant BN, and a
 * weight named like the folded one exists: both fold under fresh names, the
 * shared weight is dropped, the other user of a BN parameter keeps it. */
TEST(rewrite_names_and_dropped_weights) {
    int64_t xs[4] = {1, 2, 5, 5}, ws[4] = {3, 2, 3, 3}, cs[1] = {3};
    float x[50], w[54], p[3] = {0.5f, 1.0f, 2.0f};
    kiln_fill_randn(x, 50, 1);
    kiln_fill_randn(w, 54, 2);
    kiln_graph *g = kiln_graph_new();
    kiln_value xv = kiln_input(g, "x", KILN_F32, 4, xs);
    kiln_value wv = kiln_weight(g, "w", 4, ws, w);
    kiln_value taken = kiln_weight(g, "w_folded", 1, cs, p);
    kiln_value m = kiln_weight(g, "m", 1, cs, p), v = kiln_weight(g, "v", 1, cs, p);
    kiln_value y1 = kiln_batch_norm(g, kiln_conv2d(g, xv, wv, KILN_NONE, NULL), m, v, KILN_NONE,
                                    KILN_NONE, 1e-5);
    kiln_value y2 =
        kiln_batch_norm(g, kiln_conv2d(g, xv, wv, KILN_NONE, NULL), m, v, taken, KILN_NONE, 1e-3);
    kiln_output(g, y1, "y1");
    kiln_output(g, y2, "y2");
    kiln_output(g, kiln_binary(g, "add", m, taken), "mt");
    CHECKF(kiln_error(g)[0] == 0, "%s", kiln_error(g));
    kiln_graph *dg = decomposed(g);
    const char *names[8];
    int nw = 0;
    for (int i = 0; i < dg->n; i++)
        if (dg->nodes[i].op == OP_WEIGHT && nw < 8) names[nw++] = dg->nodes[i].name;
    /* m and w_folded (other user), two folded weights, two folded biases; v and w gone */
    EXPECT(nw == 6, "%d weights", nw);
    EXPECT(count_op(dg, OP_CONV2D) == 2 && count_kind(dg, KIND_POINTWISE) == 1, "not folded");
    for (int i = 0; i < nw; i++) {
        EXPECT(strcmp(names[i], "w") && strcmp(names[i], "v"), "weight %s copied", names[i]);
        for (int j = 0; j < i; j++) EXPECT(strcmp(names[i], names[j]), "name %s twice", names[i]);
    }
    EXPECT(has_note(dg, "w -> w_folded_2") && has_note(dg, "w -> w_folded_3"), "fresh names");
    /* and the values: against a hand fold of the first pair at one point */
    kiln_tensor in = {KILN_F32, 4, {1, 2, 5, 5}, x}, out[3];
    CHECKF(kiln_interpret(g, &in, out) == KILN_OK, "%s", kiln_error(g));
    float *y = out[0].data, *y2d = out[1].data;
    for (int o = 0; o < 3; o++) {
        double acc = 0; /* output (o, 1, 1): the full 3x3 window at the top left */
        for (int ci = 0; ci < 2; ci++)
            for (int i = 0; i < 3; i++)
                for (int j = 0; j < 3; j++)
                    acc += (double)x[ci * 25 + i * 5 + j] * w[((o * 2 + ci) * 3 + i) * 3 + j];
        double want1 = (acc - p[o]) / sqrt(p[o] + 1e-5),
               want2 = (acc - p[o]) / sqrt(p[o] + 1e-3) * p[o];
        EXPECT(fabs(y[o * 9] - want1) <= 1e-4 * (fabs(want1) + 1), "y1[%d] %g vs %g", o, y[o * 9],
               want1);
        EXPECT(fabs(y2d[o * 9] - want2) <= 1e-4 * (fabs(want2) + 1), "y2[%d] %g vs %g", o,
               y2d[o * 9], want2);
    }
    for (int i = 0; i < 3; i++) kiln_tensor_free(&out[i]);
    kiln_graph_free(dg);
    kiln_graph_free(g);
}

/* examples/conv_bn_relu.kiln: weights declared with `weight` fold; the plan
 * is a conv call and a relu kernel with no BN op left in it. */
TEST(rewrite_example_program) {
    kiln_graph *g = kiln_graph_new();
    CHECKF(kiln_parse_file(g, "examples/conv_bn_relu.kiln") == KILN_OK, "%s", kiln_error(g));
    KilnConfig cfg = kiln_config_default();
    cfg.logs = LOG_REWRITE;
    char *logtext = NULL;
    size_t loglen = 0;
    cfg.log = open_memstream(&logtext, &loglen);
    Plan *p;
    char err[256];
    kiln_status st = plan_build(g, &cfg, &p, err, sizeof err);
    fclose(cfg.log);
    CHECKF(st == KILN_OK, "%s", err);
    ConvBn c = {.relu = true};
    EXPECT(is_folded(p->dec, &c), "example not folded");
    EXPECT(strstr(logtext, "rewrite: folded batch_norm into conv2d") != NULL, "log: %s", logtext);
    /* Conv-BN-ReLU with constant weights is exactly one call: BN folded into
     * the conv, relu its epilogue; no kernel computes any part of BN */
    const Schedule *s = p->sched;
    EXPECT(cfg.extern_epilogue && s->nkernels == 1 &&
               !strcmp(s->kernels[0].kernel, "extern_kernels.conv2d"),
           "calls: %d, %s", s->nkernels, s->nkernels ? s->kernels[s->nkernels - 1].kernel : "");
    for (int k = 0; k < s->nkernels; k++)
        for (int o = 0; o < s->kernels[k].norigins; o++)
            EXPECT(strcmp(s->kernels[k].origins[o], "batch_norm"), "kernel %d computes BN", k);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    report_explain(f, s);
    fclose(f);
    EXPECT(strstr(text, "== rewrites\n  folded batch_norm into conv2d") != NULL, "explain");
    EXPECT(strstr(text, "w_folded_bias") != NULL, "explain: the folded bias");
    free(text);
    free(logtext);
    plan_free(p);
    kiln_graph_free(g);
}

/* Out of memory anywhere in the fold: a clean KILN_ERR_NOMEM, nothing leaked. */
static struct { long budget, live; } hook;
static void *failing_alloc(void *ud, void *ptr, size_t old, size_t n) {
    (void)ud;
    (void)old;
    if (n == 0) {
        if (ptr) hook.live--;
        free(ptr);
        return NULL;
    }
    if (hook.budget == 0) return NULL;
    if (hook.budget > 0) hook.budget--;
    void *r = realloc(ptr, n);
    if (r && !ptr) hook.live++;
    return r;
}

TEST(rewrite_nomem) {
    const ConvBn *c = &variants[0];
    Data d;
    make_data(c, &d, 5);
    int done = 0, failures = 0;
    hook.budget = -1;
    hook.live = 0;
    kiln_set_allocator(failing_alloc, NULL);
    for (long n = 0; n < 10000 && !done && !test_failed; n++) {
        Bound b;
        kiln_value conv;
        kiln_graph *g = build(c, &d, ~0u, &b, &conv);
        long before = hook.live;
        kiln_graph *dg = kiln_graph_new();
        hook.budget = n;
        kiln_status st = dec_run(g, dg);
        hook.budget = -1;
        if (st == KILN_OK)
            done = is_folded(dg, c) ? 1 : -1;
        else
            failures++;
        EXPECT(st == KILN_OK || st == KILN_ERR_NOMEM, "n=%ld: status %d", n, (int)st);
        kiln_graph_free(dg);
        EXPECT(hook.live == before, "n=%ld: %ld blocks leaked", n, hook.live - before);
        kiln_graph_free(g);
    }
    kiln_set_allocator(NULL, NULL);
    EXPECT(done == 1 && failures > 5, "done %d after %d failures", done, failures);
    free_data(&d);
}
