/*
 * test_lower.c -- the index simplifier, value functions and the inlining
 * policy of lower.c. Expected indices are worked out by hand from the
 * shapes (contiguous strides), not captured from the code's own output.
 */
#include "test.h"
#include "runtime/runtime.h" /* plan_build */
#include "randprog.h"

/* A pool for direct index tests; freed by the caller. */
static Pool tpool(void) {
    Pool p = {{0}, NULL};
    return p;
}

static const char *simp(Pool *p, const Index *ix, int nv, const int64_t *r) {
    return ix_str(p, ix_simplify(p, ix, nv, r));
}

static KilnConfig quiet(void) {
    KilnConfig c = kiln_config_default();
    c.logs = 0;
    return c;
}

/* Lower a graph (decomposing it first) with the default policy. */
static Plan *compile(kiln_graph *g) {
    KilnConfig c = quiet();
    Plan *p = NULL;
    char err[256];
    kiln_status st = plan_build(g, &c, &p, err, sizeof err);
    kiln_graph_free(g);
    if (st != KILN_OK) test_failf(__FILE__, __LINE__, "plan_build: %s", err);
    return p;
}

/* The computed buffer that holds output number i. */
static const Buffer *out_buf(const Plan *p, int i) { return p->prog->bufs[p->prog->outputs[i]]; }

static const char *load_index(Pool *P, const Expr *e) {
    while (e->kind == EX_OP) e = e->args[0];
    return e->kind == EX_LOAD ? ix_str(P, e->index) : "";
}

TEST(lower_ix_canonical_order) {
    Pool P = tpool();
    int64_t r[2] = {1024, 1024};
    Index *v0 = ix_var(&P, 0), *v1 = ix_var(&P, 1);
    /* v1 + 1024*v0 + 0 -> sorted by atom */
    Index *e = ix_add(&P, ix_add(&P, v1, ix_mul(&P, v0, 1024)), ix_const(&P, 0));
    EXPECT(!strcmp(simp(&P, e, 2, r), "1024*v0 + v1"), "got %s", simp(&P, e, 2, r));
    /* constants fold and collect: 2*(v0 + 3) + v0 - 6 = 3*v0 */
    Index *f = ix_add(&P, ix_mul(&P, ix_add(&P, v0, ix_const(&P, 3)), 2),
                      ix_add(&P, v0, ix_const(&P, -6)));
    EXPECT(!strcmp(simp(&P, f, 2, r), "3*v0"), "got %s", simp(&P, f, 2, r));
    pool_free(&P);
}

TEST(lower_ix_div_mod_rules) {
    Pool P = tpool();
    int64_t r[2] = {64, 16};
    Index *v0 = ix_var(&P, 0), *v1 = ix_var(&P, 1);
    /* (v0//8)*8 + v0%8 -> v0 */
    Index *a = ix_add(&P, ix_mul(&P, ix_div(&P, v0, 8), 8), ix_mod(&P, v0, 8));
    EXPECT(!strcmp(simp(&P, a, 2, r), "v0"), "recombine: %s", simp(&P, a, 2, r));
    EXPECT(!strcmp(simp(&P, ix_div(&P, v0, 1), 2, r), "v0"), "v//1");
    EXPECT(!strcmp(simp(&P, ix_mod(&P, v0, 1), 2, r), "0"), "v%%1");
    /* v1 < 16: (16*v0 + v1)//16 = v0 and (16*v0 + v1)%16 = v1 */
    Index *lin = ix_add(&P, ix_mul(&P, v0, 16), v1);
    EXPECT(!strcmp(simp(&P, ix_div(&P, lin, 16), 2, r), "v0"), "div: %s",
           simp(&P, ix_div(&P, lin, 16), 2, r));
    EXPECT(!strcmp(simp(&P, ix_mod(&P, lin, 16), 2, r), "v1"), "mod: %s",
           simp(&P, ix_mod(&P, lin, 16), 2, r));
    /* (v0//4)//2 = v0//8 ; (2*v0)//4 = v0//2 ; v0 % 64 = v0 (range) */
    EXPECT(!strcmp(simp(&P, ix_div(&P, ix_div(&P, v0, 4), 2), 2, r), "(v0//8)"), "nested div");
    EXPECT(!strcmp(simp(&P, ix_div(&P, ix_mul(&P, v0, 2), 4), 2, r), "(v0//2)"), "gcd div");
    EXPECT(!strcmp(simp(&P, ix_mod(&P, v0, 64), 2, r), "v0"), "mod in range");
    EXPECT(!strcmp(simp(&P, ix_mod(&P, v0, 8), 2, r), "(v0%8)"), "mod kept");
    pool_free(&P);
}

TEST(lower_ix_unit_range_var_is_zero) {
    Pool P = tpool();
    int64_t r[3] = {7, 1, 5};
    Index *e = ix_add(&P, ix_add(&P, ix_mul(&P, ix_var(&P, 0), 5), ix_mul(&P, ix_var(&P, 1), 5)),
                      ix_var(&P, 2));
    EXPECT(!strcmp(simp(&P, e, 3, r), "5*v0 + v2"), "got %s", simp(&P, e, 3, r));
    pool_free(&P);
}

TEST(lower_ix_affine_and_vars) {
    Pool P = tpool();
    int64_t r[2] = {8, 8}, coef[2], off;
    Index *e = ix_simplify(
        &P, ix_add(&P, ix_mul(&P, ix_var(&P, 1), 8), ix_add(&P, ix_var(&P, 0), ix_const(&P, 3))), 2,
        r);
    CHECK(ix_affine(e, 2, coef, &off));
    EXPECT(coef[0] == 1 && coef[1] == 8 && off == 3, "coef %lld %lld off %lld", (long long)coef[0],
           (long long)coef[1], (long long)off);
    EXPECT(ix_vars(e) == 3, "vars");
    EXPECT(!ix_affine(ix_simplify(&P, ix_mod(&P, ix_var(&P, 0), 3), 2, r), 2, coef, &off), "mod");
    pool_free(&P);
}

/* reshape of a contiguous tensor stays affine: x[4,6,8] as [4,48] reads
 * x at 48*v0 + v1, as [192] at v0, as [24,8] at 8*v0 + v1. */
TEST(lower_reshape_contiguous_stays_affine) {
    static const int64_t xs[3] = {4, 6, 8}, s1[2] = {4, 48}, s2[1] = {192}, s3[2] = {24, 8};
    static const struct {
        int rank;
        const int64_t *shape;
        const char *ix;
    } cases[] = {
        {2, s1, "48*v0 + v1"},
        {1, s2, "v0"},
        {2, s3, "8*v0 + v1"},
    };
    for (int i = 0; i < 3; i++) {
        kiln_graph *g = kiln_graph_new();
        int x = kiln_input(g, "x", KILN_F32, 3, xs);
        int y = kiln_binary(g, "add", kiln_reshape(g, x, cases[i].rank, cases[i].shape),
                            kiln_scalar(g, 1));
        kiln_output(g, y, "y");
        Plan *p = compile(g);
        CHECK(p);
        Pool P = tpool();
        const char *got = load_index(&P, out_buf(p, 0)->expr);
        EXPECT(!strcmp(got, cases[i].ix), "case %d: %s, want %s", i, got, cases[i].ix);
        pool_free(&P);
        plan_free(p);
    }
}

/* A reshape of a transposed tensor is not contiguous: div/mod remain, and a
 * reshape there and back again cancels to the transpose's index. */
TEST(lower_reshape_of_transpose) {
    static const int64_t xs[2] = {6, 4}, flat[1] = {24}, back[2] = {4, 6};
    kiln_graph *g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 2, xs);
    int t = kiln_transpose(g, x, 0, 1); /* [4, 6]: t[i,j] = x[j,i] */
    int f = kiln_reshape(g, t, 1, flat);
    int y = kiln_binary(g, "add", kiln_reshape(g, f, 2, back), kiln_scalar(g, 0));
    int z = kiln_binary(g, "mul", f, kiln_scalar(g, 2));
    kiln_output(g, y, "y");
    kiln_output(g, z, "z");
    Plan *p = compile(g);
    CHECK(p);
    Pool P = tpool();
    const char *yi = load_index(&P, out_buf(p, 0)->expr);
    const char *zi = load_index(&P, out_buf(p, 1)->expr);
    EXPECT(!strcmp(yi, "v0 + 4*v1"), "y: %s", yi); /* x[j, i] = 4*j + i */
    EXPECT(strstr(zi, "//") && strstr(zi, "%"), "z keeps div/mod: %s", zi);
    pool_free(&P);
    plan_free(p);
}

/* sum over dim 0 reads x transposed relative to sum over dim 1. */
TEST(lower_transposed_read_differs) {
    static const int64_t xs[2] = {64, 128};
    kiln_graph *g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 2, xs);
    int d1 = 1, d0 = 0;
    kiln_output(g, kiln_reduce(g, "sum", x, 1, &d1, 0), "a");
    kiln_output(g, kiln_reduce(g, "sum", x, 1, &d0, 0), "b");
    Plan *p = compile(g);
    CHECK(p);
    Pool P = tpool();
    const Buffer *a = out_buf(p, 0), *b = out_buf(p, 1);
    EXPECT(a->body == BODY_REDUCTION && a->np == 1 && a->size[0] == 64 && a->rsize[0] == 128, "a");
    EXPECT(b->np == 1 && b->size[0] == 128 && b->rsize[0] == 64, "b");
    EXPECT(!strcmp(load_index(&P, a->expr), "128*v0 + v1"), "a: %s", load_index(&P, a->expr));
    EXPECT(!strcmp(load_index(&P, b->expr), "v0 + 128*v1"), "b: %s", load_index(&P, b->expr));
    pool_free(&P);
    plan_free(p);
}

TEST(lower_chain_is_one_buffer) {
    static const int64_t s[2] = {1024, 1024};
    kiln_graph *g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 2, s);
    int y = kiln_unary(
        g, "sin",
        kiln_binary(g, "mul", kiln_unary(g, "relu", kiln_binary(g, "add", x, kiln_scalar(g, 1))),
                    kiln_scalar(g, 2)));
    kiln_output(g, y, "y");
    Plan *p = compile(g);
    CHECK(p);
    CHECK(p->prog->ncomputed == 1);
    const Buffer *b = out_buf(p, 0);
    CHECK(b->body == BODY_POINTWISE && b->norigins == 4);
    const char *want[4] = {"add", "mul", "relu", "sin"};
    for (int i = 0; i < 4; i++) EXPECT(!strcmp(b->origins[i], want[i]), "origin %d", i);
    /* the loop IR dump (text is the clearest statement of the body) */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    lower_print_buffer(f, p->prog, b);
    fclose(f);
    EXPECT(!strcmp(text, "buf0: Pointwise([1024, 1024], sin(relu(load(x, 1024*v0 + v1) + 1.0) * "
                         "2.0)) origins=[add, mul, relu, sin] (output)\n"),
           "%s", text);
    free(text);
    plan_free(p);
}

static const InlineDecision *decision_for_op(const LoopProgram *p, Op op) {
    for (int i = 0; i < p->ndec; i++)
        if (graph_node(p->g, p->dec[i].node)->op == op) return &p->dec[i];
    return NULL;
}

TEST(lower_inline_policy) {
    static const int64_t s[2] = {32, 16};
    /* softmax: exp has 2 users and is expensive -> materialized */
    kiln_graph *g = kiln_graph_new();
    kiln_output(g, kiln_softmax(g, kiln_input(g, "x", KILN_F32, 2, s), 1), "y");
    Plan *p = compile(g);
    CHECK(p);
    const InlineDecision *d = decision_for_op(p->prog, OP_EXP);
    CHECK(d && d->buf >= 0 && strstr(d->reason, "expensive op (exp)"));
    d = decision_for_op(p->prog, OP_SUB);
    CHECK(d && d->buf < 0); /* x - amax is recomputed in exp */
    plan_free(p);
    /* a cheap value with 5 users is materialized, with 2 users it is not */
    g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 2, s);
    int t = kiln_binary(g, "add", x, kiln_scalar(g, 1));
    int u = kiln_binary(g, "mul", x, kiln_scalar(g, 3));
    int acc = kiln_binary(g, "mul", u, u);
    for (int i = 0; i < 5; i++) acc = kiln_binary(g, "sub", acc, t);
    kiln_output(g, acc, "y");
    p = compile(g);
    CHECK(p);
    d = decision_for_op(p->prog, OP_ADD);
    CHECK(d && d->buf >= 0 && !strcmp(d->reason, "5 users > max_inline_users 4"));
    d = NULL;
    for (int i = 0; i < p->prog->ndec; i++)
        if (graph_node(p->prog->g, p->prog->dec[i].node)->op == OP_MUL &&
            p->prog->dec[i].users == 2)
            d = &p->prog->dec[i];
    CHECK(d && d->buf < 0);
    plan_free(p);
}

/* 40 adds in a row: the body passes max_inline_ops and is cut into buffers,
 * which the scheduler fuses back into one kernel. */
TEST(lower_max_inline_ops) {
    static const int64_t s[1] = {256};
    kiln_graph *g = kiln_graph_new();
    int v = kiln_input(g, "x", KILN_F32, 1, s);
    for (int i = 0; i < 40; i++) v = kiln_binary(g, "add", v, kiln_scalar(g, i));
    kiln_output(g, v, "y");
    Plan *p = compile(g);
    CHECK(p);
    CHECK(p->prog->ncomputed == 2);
    int cut = 0;
    for (int i = 0; i < p->prog->ndec; i++)
        cut += strstr(p->prog->dec[i].reason, "max_inline_ops") != NULL;
    EXPECT(cut == 1, "cut %d", cut);
    EXPECT(p->sched->nkernels == 1, "kernels %d", p->sched->nkernels);
    plan_free(p);
}

/* matmul(x, transpose(w)): the transposed operand is a strided view of w. */
TEST(lower_extern_strided_operand) {
    static const int64_t xs[2] = {8, 5}, ws[2] = {3, 5};
    kiln_graph *g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 2, xs), w = kiln_input(g, "w", KILN_F32, 2, ws);
    kiln_output(g, kiln_matmul(g, x, kiln_transpose(g, w, 0, 1)), "y");
    Plan *p = compile(g);
    CHECK(p);
    CHECK(p->prog->ncomputed == 1);
    const Buffer *b = out_buf(p, 0);
    CHECK(b->body == BODY_EXTERN && b->nopnds == 2);
    const BufView *v = &b->opnd[1];
    EXPECT(!strcmp(p->prog->bufs[v->buf]->name, "w"), "operand %s", p->prog->bufs[v->buf]->name);
    EXPECT(v->shape[0] == 5 && v->shape[1] == 3 && v->stride[0] == 1 && v->stride[1] == 5,
           "strides %lld %lld", (long long)v->stride[0], (long long)v->stride[1]);
    plan_free(p);
}

/* An extern operand that is computed is materialized, with the reason. */
TEST(lower_extern_operand_materialized) {
    static const int64_t s[2] = {8, 8};
    kiln_graph *g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 2, s);
    kiln_output(g, kiln_matmul(g, kiln_unary(g, "relu", x), x), "y");
    Plan *p = compile(g);
    CHECK(p);
    const InlineDecision *d = decision_for_op(p->prog, OP_RELU);
    CHECK(d && d->buf >= 0 && !strcmp(d->reason, "read by an extern kernel"));
    plan_free(p);
}

/* A view that is an output is copied: its buffer reads x transposed. */
TEST(lower_view_output_copied) {
    static const int64_t s[2] = {3, 7};
    kiln_graph *g = kiln_graph_new();
    kiln_output(g, kiln_transpose(g, kiln_input(g, "x", KILN_F32, 2, s), 0, 1), "t");
    Plan *p = compile(g);
    CHECK(p);
    const Buffer *b = out_buf(p, 0);
    CHECK(b->body == BODY_POINTWISE && b->size[0] == 7 && b->size[1] == 3);
    Pool P = tpool();
    EXPECT(!strcmp(load_index(&P, b->expr), "v0 + 7*v1"), "%s", load_index(&P, b->expr));
    pool_free(&P);
    plan_free(p);
}

/* broadcasting: b[N] read at v1, a keepdim [M,1] statistic read at v0 */
TEST(lower_broadcast_indices) {
    static const int64_t s[2] = {16, 32}, bs[1] = {32};
    kiln_graph *g = kiln_graph_new();
    int x = kiln_input(g, "x", KILN_F32, 2, s), b = kiln_input(g, "b", KILN_F32, 1, bs);
    int d = 1;
    int m = kiln_reduce(g, "amax", x, 1, &d, 1);
    kiln_output(g, kiln_binary(g, "add", kiln_binary(g, "sub", x, m), b), "y");
    Plan *p = compile(g);
    CHECK(p);
    Pool P = tpool();
    Str s2;
    str_init(&s2, &P);
    ex_print(&s2, p->prog, out_buf(p, 0)->expr);
    EXPECT(!strcmp(str_get(&s2), "load(x, 32*v0 + v1) - load(buf0, v0) + load(b, v1)"), "%s",
           str_get(&s2));
    pool_free(&P);
    plan_free(p);
}

/* dropout: the random value is a buffer of its own, never an expression. */
TEST(lower_random_materialized_once) {
    static const int64_t s[1] = {100};
    kiln_graph *g = kiln_graph_new();
    int d = kiln_dropout(g, kiln_input(g, "x", KILN_F32, 1, s), 0.5, 42);
    kiln_output(g, kiln_binary(g, "add", d, kiln_scalar(g, 1)), "a");
    kiln_output(g, kiln_binary(g, "mul", d, kiln_scalar(g, 2)), "b");
    Plan *p = compile(g);
    CHECK(p);
    int nrand = 0;
    for (int i = 0; i < p->prog->nbufs; i++)
        if (p->prog->bufs[i]->body == BODY_RAND) {
            nrand++;
            EXPECT(p->prog->bufs[i]->seed == 42, "seed");
        }
    EXPECT(nrand == 1, "rand buffers %d", nrand);
    plan_free(p);
}

TEST(lower_rejects_composites) {
    static const int64_t s[1] = {4};
    kiln_graph *g = kiln_graph_new();
    kiln_output(g, kiln_softmax(g, kiln_input(g, "x", KILN_F32, 1, s), 0), "y");
    LoopProgram *lp = NULL;
    char err[128];
    KilnConfig c = quiet();
    EXPECT(lower_run(g, &c, &lp, err, sizeof err) == KILN_ERR_INPUT, "status");
    EXPECT(lp == NULL && strstr(err, "softmax"), "%s", err);
    kiln_graph_free(g);
}

TEST(lower_logs_from_env) {
    setenv("KILN_LOGS", "fusion,loop_ir,bogus", 1);
    unsigned bits = loop_logs_from_env();
    unsetenv("KILN_LOGS");
    EXPECT(bits == (LOG_FUSION | LOG_LOOP_IR), "bits %u", bits);
    EXPECT(loop_logs_from_env() == 0, "unset");
}

/* ===== the loop IR means what the graph means ==========================================
 * A plain evaluator of buffers (the index algebra evaluated directly, ops in
 * float, reductions in loop order), run kernel by kernel in the schedule's
 * call order, against the reference interpreter on random programs. It
 * checks the lowering (views composed into indices, broadcasting, reshapes
 * simplified) and that the call order respects every dependency; the stage
 * check below covers the order inside fused kernels. */

static int64_t ix_eval(const Index *ix, const int64_t *v) {
    int64_t a, r = 0;
    switch (ix->kind) {
    case IX_VAR: return v[ix->v];
    case IX_CONST: return ix->v;
    case IX_ADD:
        for (int i = 0; i < ix->n; i++) r += ix_eval(ix->a[i], v);
        return r;
    case IX_MUL: return ix_eval(ix->a[0], v) * ix->v;
    case IX_FLOORDIV: a = ix_eval(ix->a[0], v); return a / ix->v - (a % ix->v != 0 && a < 0);
    case IX_MOD: a = ix_eval(ix->a[0], v) % ix->v; return a < 0 ? a + ix->v : a;
    }
    return 0;
}

/* Transcendentals in double, rounded once: correctly rounded, as the
 * interpreter computes them (a comparison on them must not flip by an ulp). */
static float apply(Op op, const float *x) {
    float a = x[0], b = x[1];
    switch (op) {
    case OP_NEG: return -a;
    case OP_ABS: return fabsf(a);
    case OP_RELU: return a < 0 ? 0.0f : a;
    case OP_SIGMOID: return (float)(1.0 / (1.0 + exp(-(double)a)));
    case OP_TANH: return (float)tanh(a);
    case OP_EXP: return (float)exp(a);
    case OP_LOG: return (float)log(a);
    case OP_SQRT: return sqrtf(a);
    case OP_RSQRT: return (float)(1.0 / sqrt((double)a));
    case OP_SIN: return (float)sin(a);
    case OP_COS: return (float)cos(a);
    case OP_ERF: return (float)erf(a);
    case OP_GELU: return (float)(0.5 * (double)a * erfc(-(double)a * M_SQRT1_2));
    case OP_FLOOR: return floorf(a);
    case OP_CEIL: return ceilf(a);
    case OP_RECIPROCAL: return 1.0f / a;
    case OP_LOGICAL_NOT: return a == 0.0f;
    case OP_COPY: return a;
    case OP_ADD: return a + b;
    case OP_SUB: return a - b;
    case OP_MUL: return a * b;
    case OP_DIV: return a / b;
    case OP_TRUE_DIV: return a / b;
    case OP_POW: return (float)pow(a, b);
    case OP_FMOD: return fmodf(a, b);
    case OP_MAXIMUM: return (a != a || a > b) ? a : b;
    case OP_MINIMUM: return (a != a || a < b) ? a : b;
    case OP_LT: return a < b;
    case OP_LE: return a <= b;
    case OP_GT: return a > b;
    case OP_GE: return a >= b;
    case OP_EQ: return a == b;
    case OP_NE: return a != b;
    case OP_WHERE: return a != 0.0f ? b : x[2];
    default: return NAN;
    }
}

static float ev(float **data, const Expr *e, const int64_t *v) {
    if (e->kind == EX_CONST) return (float)e->value;
    if (e->kind == EX_LOAD) return data[e->buf][ix_eval(e->index, v)];
    if (e->kind == EX_SELECT) { /* only the chosen branch: the other may read out of bounds */
        int64_t i = ix_eval(e->index, v);
        bool in = (e->lo == EX_NOLO || i >= e->lo) && (e->hi == EX_NOHI || i < e->hi);
        return ev(data, e->args[in ? 0 : 1], v);
    }
    float x[3] = {0, 0, 0};
    for (int i = 0; i < e->nargs; i++) x[i] = ev(data, e->args[i], v);
    return apply(e->op, x);
}

/* Odometer over sizes; false when done. */
static bool step(int n, const int64_t *size, int64_t *v) {
    for (int d = n - 1; d >= 0; d--) {
        if (++v[d] < size[d]) return true;
        v[d] = 0;
    }
    return false;
}

/* Reductions accumulate in double: closer to the exact value than any
 * float order, so the interpreter's own order stays within tolerance even
 * where a result is ill-conditioned (layer_norm of a constant row). */
static void eval_reduction(float **data, const Buffer *b) {
    int64_t v[2 * KILN_MAX_RANK] = {0}, sizes[2 * KILN_MAX_RANK];
    memcpy(sizes, b->size, sizeof(int64_t) * (size_t)b->np);
    memcpy(sizes + b->np, b->rsize, sizeof(int64_t) * (size_t)b->nr);
    double *acc = malloc(sizeof(double) * (size_t)b->numel);
    for (int64_t i = 0; i < b->numel; i++)
        acc[i] = b->rop == ROP_SUM    ? 0.0
                 : b->rop == ROP_PROD ? 1.0
                 : b->rop == ROP_AMAX ? -INFINITY
                                      : INFINITY;
    do {
        int64_t at = 0;
        for (int d = 0; d < b->np; d++) at = at * b->size[d] + v[d];
        double x = ev(data, b->expr, v);
        switch (b->rop) {
        case ROP_SUM: acc[at] += x; break;
        case ROP_PROD: acc[at] *= x; break;
        case ROP_AMAX:
            if (x != x || x > acc[at]) acc[at] = x;
            break;
        case ROP_AMIN:
            if (x != x || x < acc[at]) acc[at] = x;
            break;
        }
    } while (step(b->np + b->nr, sizes, v));
    for (int64_t i = 0; i < b->numel; i++) data[b->id][i] = (float)acc[i];
    free(acc);
}

/* matmul over strided operand views, batch dims broadcast (numpy). */
static void eval_matmul(float **data, const Buffer *b) {
    const BufView *A = &b->opnd[0], *B = &b->opnd[1];
    int r = b->rank;
    int64_t M = b->shape[r - 2], Nn = b->shape[r - 1], K = A->shape[A->rank - 1];
    int64_t v[KILN_MAX_RANK] = {0};
    for (int64_t o = 0; o < b->numel; o++) {
        int64_t ao = A->offset, bo = B->offset;
        for (int d = 0; d < r - 2; d++) {
            int da = d - (r - A->rank), db = d - (r - B->rank);
            if (da >= 0 && A->shape[da] != 1) ao += v[d] * A->stride[da];
            if (db >= 0 && B->shape[db] != 1) bo += v[d] * B->stride[db];
        }
        int64_t i = v[r - 2], j = v[r - 1];
        float acc = 0;
        for (int64_t k = 0; k < K; k++)
            acc += data[A->buf][ao + i * A->stride[A->rank - 2] + k * A->stride[A->rank - 1]] *
                   data[B->buf][bo + k * B->stride[B->rank - 2] + j * B->stride[B->rank - 1]];
        data[b->id][o] = acc;
        step(r, b->shape, v);
    }
    (void)M;
    (void)Nn;
}

static void eval_buffer(float **data, const Buffer *b) {
    int64_t v[KILN_MAX_RANK] = {0};
    switch (b->body) {
    case BODY_POINTWISE:
        for (int64_t i = 0; i < b->numel; i++) {
            data[b->id][i] = ev(data, b->expr, v);
            step(b->np, b->size, v);
        }
        return;
    case BODY_RAND:
        for (int64_t i = 0; i < b->numel; i++)
            data[b->id][i] = util_rand_uniform(b->seed, (uint64_t)i);
        return;
    case BODY_REDUCTION: eval_reduction(data, b); return;
    case BODY_EXTERN: eval_matmul(data, b); return;
    default: return;
    }
}

/* Inside a kernel, a member runs at or after what it reads (strictly after a
 * reduction: its row is complete only when its stage ends). */
static bool stages_valid(const Schedule *s, const Kernel *k) {
    for (int i = 0; i < k->n; i++) {
        const SNode *x = &s->nodes[k->members[i]];
        for (int d = 0; d < x->ndeps; d++) {
            int p = x->deps[d].write ? -1 : s->node_of_buf[x->deps[d].buf];
            for (int j = 0; j < k->n && p >= 0; j++) {
                if (k->members[j] != p) continue;
                bool red = s->nodes[p].body == BODY_REDUCTION;
                if (j >= i || k->stage[j] > k->stage[i] || (red && k->stage[j] == k->stage[i]))
                    return false;
            }
        }
    }
    return true;
}

/* Run the plan's buffers in call order; compare outputs with interp_run. */
static int check_against_interpreter(Plan *pl, uint64_t seed, double *worst) {
    const LoopProgram *p = pl->prog;
    const Schedule *s = pl->sched;
    float **data = calloc((size_t)p->nbufs, sizeof(float *));
    float **in = calloc((size_t)p->ninputs + 1, sizeof(float *));
    float **out = calloc((size_t)p->noutputs + 1, sizeof(float *));
    for (int b = 0; b < p->nbufs; b++) {
        data[b] = malloc(sizeof(float) * (size_t)(p->bufs[b]->numel + 1));
        for (int64_t i = 0; i < p->bufs[b]->numel; i++) data[b][i] = NAN; /* unwritten: NaN */
        if (p->bufs[b]->body == BODY_WEIGHT)
            memcpy(data[b], p->bufs[b]->data, sizeof(float) * (size_t)p->bufs[b]->numel);
    }
    for (int i = 0; i < p->ninputs; i++) {
        const Buffer *b = p->bufs[p->inputs[i]];
        kiln_fill_randn(data[b->id], b->numel, seed * 31 + (uint64_t)i);
        if (b->dtype == KILN_BOOL)
            for (int64_t j = 0; j < b->numel; j++) data[b->id][j] = data[b->id][j] > 0;
        in[i] = data[b->id];
    }
    int bad = 0, *seen = calloc((size_t)s->nnodes + 1, sizeof(int));
    for (int k = 0; k < s->nkernels; k++) /* every node in exactly one kernel */
        for (int i = 0; i < s->kernels[k].n; i++) seen[s->kernels[k].members[i]]++;
    for (int i = 0; i < s->nnodes; i++) bad += seen[i] != 1;
    free(seen);
    for (int k = 0; k < s->nkernels; k++) {
        bad += !stages_valid(s, &s->kernels[k]);
        for (int i = 0; i < s->kernels[k].n; i++)
            eval_buffer(data, p->bufs[s->nodes[s->kernels[k].members[i]].buf]);
    }
    if (interp_run(pl->dec, in, out) != KILN_OK) bad++;
    for (int o = 0; o < p->noutputs && !bad; o++) {
        const Buffer *b = p->bufs[p->outputs[o]];
        for (int64_t i = 0; i < b->numel; i++) {
            double x = data[b->id][i], y = out[o][i], err = fabs(x - y) / (1.0 + fabs(y));
            if (x != x && y != y) continue;
            if (!(err <= 1e-4)) {
                printf("  output %d [%lld]: loop IR %.9g, interpreter %.9g\n", o, (long long)i, x,
                       y);
                bad++;
                break;
            }
            if (err > *worst) *worst = err;
        }
    }
    for (int b = 0; b < p->nbufs; b++) free(data[b]);
    for (int o = 0; o < p->noutputs; o++) kfree(out[o]);
    free(data);
    free(in);
    free(out);
    return bad;
}

TEST(lower_matches_interpreter_random) {
    static char src[1 << 16];
    double worst = 0;
    int checked = 0, want = getenv("KILN_TEST_SEEDS") ? atoi(getenv("KILN_TEST_SEEDS")) : 1000;
    for (uint64_t seed = 1; seed <= (uint64_t)want; seed++) {
        randprog(seed, src, sizeof src);
        kiln_graph *g = kiln_graph_new();
        CHECKF(kiln_parse(g, src, "rand.kiln") == KILN_OK, "seed %llu: %s",
               (unsigned long long)seed, kiln_error(g));
        Plan *p = compile(g);
        CHECK(p);
        int bad = check_against_interpreter(p, seed, &worst);
        plan_free(p);
        CHECKF(!bad, "seed %llu: loop IR differs from the interpreter\n%s",
               (unsigned long long)seed, src);
        checked++;
    }
    EXPECT(checked == want, "checked %d", checked);
}

/* The seed programs and a few shapes randprog does not make: matmul with a
 * transposed operand, dropout, slices with steps, bool values. */
TEST(lower_matches_interpreter_cases) {
    static const char *const progs[] = {
        "input x: f32[16, 8]\ninput w: f32[12, 8]\ny = relu((x + 1) @ transpose(w, 0, 1))\noutput y\n",
        "input x: f32[33, 17]\nd = dropout(x, p=0.3, seed=5)\na = d + 1\nb = d * 2\noutput a, b\n",
        "input x: f32[20, 30]\ns = slice(slice(x, 1, 3, 29, step=4), 0, 1, 19, step=3)\n"
        "y = where(s > 0, s, -s) + sum(s, dim=1, keepdim=true)\noutput y\n",
        "input x: f32[6, 4, 5]\nt = reshape(permute(x, [2, 0, 1]), [5, 24])\n"
        "y = softmax(t, 1) + reshape(sum(x, dim=[0, 1]), [5, 1])\noutput y\n",
        "input x: f32[64, 64]\nt = relu(x * 2 + 1)\ny = relu(t - mean(t)) * 3\noutput y\n",
        /* fusing op7+op8 first makes op9 depend on op5: (op5, op9) would be a cycle */
        "input x: f32[4, 1, 5]\na = softmax(x, dim=1)\nb = amax(x, dim=1)\n"
        "c = layer_norm(x, [1, 5])\nd = sum(x, dim=[1], keepdim=true) * x\noutput a, b, c, d\n",
        "input x: f32[2, 3, 8, 5]\ny = layer_norm(x, [8, 5]) * 2\n"
        "z = matmul(reshape(x, [6, 8, 5]), transpose(reshape(x, [6, 8, 5]), 1, 2))\noutput y, z\n",
    };
    for (size_t i = 0; i < sizeof progs / sizeof *progs; i++) {
        kiln_graph *g = kiln_graph_new();
        if (kiln_parse(g, progs[i], "case.kiln") != KILN_OK) {
            EXPECT(0, "case %zu: %s", i, kiln_error(g));
            kiln_graph_free(g);
            continue;
        }
        Plan *p = compile(g);
        CHECK(p);
        double worst = 0;
        EXPECT(!check_against_interpreter(p, 7 + i, &worst), "case %zu differs", i);
        plan_free(p);
    }
}

/* Random programs aimed at the scheduler: one [R, C] shape, many outputs,
 * row, column and whole reductions (keepdim, so everything broadcasts back),
 * softmax and broadcasting binaries: lots of vertical, horizontal and
 * outer-loop candidates whose fusions change each other's dependencies. */
static void rowprog(uint64_t seed, char *buf, size_t cap) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
#define RND(n) (s ^= s << 13, s ^= s >> 7, s ^= s << 17, (int)(s % (uint64_t)(n)))
    int R = 1 + RND(9), C = 1 + RND(12), n = 6 + RND(18), nv = 2;
    size_t w =
        (size_t)snprintf(buf, cap, "input v0: f32[%d, %d]\ninput v1: f32[%d, %d]\n", R, C, R, C);
    static const char *const un[] = {"tanh", "sin", "relu", "abs", "sigmoid", "neg"};
    static const char *const bin[] = {"+", "-", "*"};
    static const char *const red[] = {"sum", "amax", "amin", "mean"};
    char outs[2048] = "";
    for (int i = 0; i < n; i++, nv++) {
        int a = RND(nv), b = RND(nv), k = RND(8), u = RND(6), o = RND(3), r = RND(4), d = RND(2);
        if (k < 2)
            w += (size_t)snprintf(buf + w, cap - w, "v%d = %s(v%d)\n", nv, un[u], a);
        else if (k < 4)
            w += (size_t)snprintf(buf + w, cap - w, "v%d = v%d %s v%d\n", nv, a, bin[o], b);
        else if (k < 6)
            w += (size_t)snprintf(buf + w, cap - w,
                                  "v%d = %s(v%d, dim=%d, keepdim=true) * 0.5 + v%d\n", nv, red[r],
                                  a, d, b);
        else if (k < 7)
            w += (size_t)snprintf(buf + w, cap - w, "v%d = softmax(v%d, 1) + v%d\n", nv, a, b);
        else
            w += (size_t)snprintf(buf + w, cap - w, "v%d = v%d - mean(v%d)\n", nv, a, b);
        if (RND(3) == 0 || i == n - 1) {
            size_t l = strlen(outs);
            snprintf(outs + l, sizeof outs - l, "%sv%d", *outs ? ", " : "", nv);
        }
    }
    snprintf(buf + w, cap - w, "output %s\n", outs);
#undef RND
}

TEST(lower_matches_interpreter_rowprogs) {
    static char src[1 << 14];
    double worst = 0;
    int want = getenv("KILN_TEST_SEEDS") ? atoi(getenv("KILN_TEST_SEEDS")) : 1000;
    for (int seed = 1; seed <= want; seed++) {
        rowprog((uint64_t)seed, src, sizeof src);
        kiln_graph *g = kiln_graph_new();
        CHECKF(kiln_parse(g, src, "row.kiln") == KILN_OK, "seed %d: %s\n%s", seed, kiln_error(g),
               src);
        Plan *p = compile(g);
        CHECK(p);
        int bad = check_against_interpreter(p, (uint64_t)seed, &worst);
        plan_free(p);
        CHECKF(!bad, "seed %d: loop IR differs from the interpreter\n%s", seed, src);
    }
}

/* The program generator itself: a value larger than 8192 elements (a pool
 * over a concat) had no broadcast partner and randprog divided by zero
 * (fuzz-diff crashed at seed 1796007215170098). It pairs with itself now;
 * the program must come out and parse. */
TEST(lower_randprog_large_value_has_partner) {
    char src[8192];
    size_t n = randprog(1796007215170098ull, src, sizeof src);
    EXPECT(n > 0 && n < sizeof src, "randprog wrote %zu bytes", n);
    kiln_graph *g = kiln_graph_new();
    EXPECT(kiln_parse(g, src, "rand.kiln") == KILN_OK, "%s\n%s", kiln_error(g), src);
    kiln_graph_free(g);
}
