/*
 * test_check.c -- the IR checkers between stages: loop_check (src/loop/
 * check.c) and sched_check (src/sched/check.c).
 *
 * Two halves. First, every valid IR passes: each example in examples/, each
 * golden case in tests/golden/cases and a batch of random programs from
 * tests/randprog.c, under the default config and under configs that steer
 * lowering and the scheduler elsewhere (max_fusion_size 2, one round, no
 * extern epilogues, a small register budget with one inline user, no
 * rounds at all), lower and schedule with both checks
 * reporting KILN_OK (plan_build runs them too; the tests call them again to
 * see the status and an empty message). Second, before/expected tests: a
 * valid IR corrupted in one specific way (a load of a later buffer, a range
 * of 0, two kernels swapped, ...) must fail with a message naming the
 * buffer or kernel, written out in full here; each test restores the field
 * and checks the IR passes again, so the failure came from that corruption
 * and freeing still sees the IR lowering built.
 */
#include "test.h"
#include "runtime/runtime.h" /* plan_build */
#include "randprog.h"
#include <dirent.h>

#define RAND_SEED0 1000
#define RAND_COUNT 1000

static KilnConfig quiet(void) {
    KilnConfig c = kiln_config_default();
    c.logs = 0;
    return c;
}

/* Parse src (or, when src is NULL, the file at path, whose weights may be
 * .npy files beside it) and build its plan under cfg (NULL: quiet
 * defaults); NULL on failure (recorded). */
static Plan *plan_from(const char *src, const char *path, const KilnConfig *cfg) {
    KilnConfig c = cfg ? *cfg : quiet();
    kiln_graph *g = kiln_graph_new();
    Plan *p = NULL;
    char err[512];
    if ((src ? kiln_parse(g, src, "test_check") : kiln_parse_file(g, path)) != KILN_OK) {
        test_failf(__FILE__, __LINE__, "parse: %s", kiln_error(g));
    } else if (plan_build(g, &c, &p, err, sizeof err) != KILN_OK) {
        test_failf(__FILE__, __LINE__, "plan_build: %s", err);
        p = NULL;
    }
    kiln_graph_free(g);
    return p;
}

static Plan *plan_of(const char *src, const KilnConfig *cfg) { return plan_from(src, NULL, cfg); }

/* Both checkers pass on p; what names the program in a failure. */
static bool both_pass(const Plan *p, const char *what) {
    char err[512] = "x";
    kiln_status st = loop_check(p->prog, err, sizeof err);
    EXPECT(st == KILN_OK && !err[0], "%s: loop_check %d: %s", what, (int)st, err);
    if (st != KILN_OK) return false;
    strcpy(err, "x");
    st = sched_check(p->sched, err, sizeof err);
    EXPECT(st == KILN_OK && !err[0], "%s: sched_check %d: %s", what, (int)st, err);
    return st == KILN_OK;
}

/* The configs the pass tests run under: defaults, then ones that make the
 * scheduler take other paths. */
static int configs(KilnConfig *c) {
    for (int i = 0; i < 6; i++) c[i] = quiet();
    c[1].max_fusion_size = 2;
    c[2].max_rounds = 1;
    c[3].extern_epilogue = false;
    c[4].vector_registers = 4;
    c[4].max_inline_users = 1;
    c[5].max_rounds = 0;
    return 6;
}

/* Build the plan of src (NULL: the file at what) under each config and
 * check it; false on a failure. */
static bool passes_all_configs(const char *src, const char *what) {
    KilnConfig c[8];
    int n = configs(c);
    for (int i = 0; i < n; i++) {
        char name[700];
        snprintf(name, sizeof name, "%s (config %d)", what, i);
        Plan *p = plan_from(src, what, &c[i]);
        if (!p) {
            test_failf(__FILE__, __LINE__, "%s did not build", name);
            return false;
        }
        bool ok = both_pass(p, name);
        plan_free(p);
        if (!ok) return false;
    }
    return true;
}

/* ===== valid IR passes =========================================================== */

TEST(check_examples_pass) {
    DIR *d = opendir("examples");
    CHECK(d);
    int n = 0, bad = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".kiln")) continue;
        char path[600];
        snprintf(path, sizeof path, "examples/%s", e->d_name);
        bad += !passes_all_configs(NULL, path);
        n++;
    }
    closedir(d);
    EXPECT(n >= 10, "only %d examples", n);
    EXPECT(bad == 0, "%d of %d examples failed a check", bad, n);
}

TEST(check_golden_cases_pass) {
    char root[512];
    snprintf(root, sizeof root, "%s/golden/cases", test_srcdir());
    DIR *d = opendir(root);
    CHECK(d);
    int n = 0, bad = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[1100];
        snprintf(path, sizeof path, "%s/%s/prog.kiln", root, e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        fclose(f);
        bad += !passes_all_configs(NULL, path);
        n++;
    }
    closedir(d);
    EXPECT(n >= 50, "only %d golden cases", n);
    EXPECT(bad == 0, "%d of %d golden cases failed a check", bad, n);
}

TEST(check_random_programs_pass) {
    static char text[4096];
    int bad = 0;
    for (int i = 0; i < RAND_COUNT; i++) {
        uint64_t seed = RAND_SEED0 + (uint64_t)i;
        char what[64];
        randprog(seed, text, sizeof text);
        snprintf(what, sizeof what, "random program seed %llu", (unsigned long long)seed);
        bad += !passes_all_configs(text, what);
    }
    EXPECT(bad == 0, "%d of %d random programs failed a check", bad, RAND_COUNT);
}

/* Traffic may grow under fusion, and sched_check must not call it a bug: an
 * extern operand that is not a strided view (a reshape of a transpose) is
 * copied by a kernel of its own, traffic an eager framework never counts.
 * x[4,6] -> [6,4] -> [3,8] @ w[8,5]: unfused, the matmul reads 24 + 40 and
 * writes 15 floats (316 bytes); fused, the copy reads and writes 24, then
 * the matmul reads 24 + 40 and writes 15 (508 bytes). */
TEST(check_fused_traffic_may_exceed_unfused) {
    Plan *p = plan_of("input x: f32[4, 6]\n"
                      "weight w: f32[8, 5] = randn(7)\n"
                      "y = reshape(permute(x, [1, 0]), [3, 8]) @ w\n"
                      "output y\n",
                      NULL);
    CHECK(p);
    EXPECT(p->sched->unfused_bytes == 316, "unfused %lld", (long long)p->sched->unfused_bytes);
    EXPECT(p->sched->fused_bytes == 508, "fused %lld", (long long)p->sched->fused_bytes);
    both_pass(p, "permute-reshape-matmul");
    plan_free(p);
}

/* ===== loop_check: corrupted loop IR fails, naming the buffer ========================= */

/* loop_check fails on p with exactly "loop IR check: " want. */
static void loop_fails(const Plan *p, const char *want, int line) {
    char err[512] = "";
    kiln_status st = loop_check(p->prog, err, sizeof err);
    char full[512];
    snprintf(full, sizeof full, "loop IR check: %s", want);
    if (st != KILN_ERR_INPUT || strcmp(err, full))
        test_failf(__FILE__, line, "loop_check %d: '%s', want '%s'", (int)st, err, full);
}

/* And passes again once restored. */
static void loop_passes(const Plan *p, int line) {
    char err[512] = "";
    if (loop_check(p->prog, err, sizeof err) != KILN_OK)
        test_failf(__FILE__, line, "restored IR fails: %s", err);
}

/* The buffer named name. */
static Buffer *buf_named(const Plan *p, const char *name) {
    for (int i = 0; i < p->prog->nbufs; i++)
        if (!strcmp(p->prog->bufs[i]->name, name)) return p->prog->bufs[i];
    return NULL;
}

/* The first load of buffer `of` in e (depth first), or NULL. */
static Expr *find_load(Expr *e, int of) {
    if (e->kind == EX_LOAD) return e->buf == of ? e : NULL;
    for (int i = 0; e->kind >= EX_OP && i < e->nargs; i++) {
        Expr *r = find_load(e->args[i], of);
        if (r) return r;
    }
    return NULL;
}

/* softmax over rows: buf0 = amax, buf1 = exp(x - buf0), buf2 = sum(buf1),
 * buf3 = buf1 / buf2 (ids: x 0, buf0 1, buf1 2, buf2 3, buf3 4). */
static const char *SOFTMAX = "input x: f32[16, 32]\ny = softmax(x, dim=1)\noutput y\n";

TEST(check_loop_load_of_later_buffer) {
    Plan *p = plan_of(SOFTMAX, NULL);
    CHECK(p);
    Buffer *b1 = buf_named(p, "buf1"), *b0 = buf_named(p, "buf0"), *b3 = buf_named(p, "buf3");
    CHECK(b1 && b0 && b3 && b1->body == BODY_POINTWISE);
    Expr *ld = find_load(b1->expr, b0->id);
    CHECK(ld);
    ld->buf = b3->id; /* buf1 now reads the division's result */
    loop_fails(p, "buf1 loads buf3, which is computed later", __LINE__);
    ld->buf = b1->id; /* ... or itself */
    loop_fails(p, "buf1 loads itself", __LINE__);
    ld->buf = 99;
    loop_fails(p, "buf1 loads buffer id 99, outside the program's 5 buffers", __LINE__);
    ld->buf = b0->id;
    loop_passes(p, __LINE__);
    plan_free(p);
}

TEST(check_loop_index_outside_iteration_space) {
    Plan *p = plan_of(SOFTMAX, NULL);
    CHECK(p);
    /* buf0 = amax over v1 of x[32*v0 + v1]: parallel v0, reduced v1 */
    Buffer *b0 = buf_named(p, "buf0"), *b1 = buf_named(p, "buf1");
    CHECK(b0 && b0->body == BODY_REDUCTION && b0->np == 1 && b0->nr == 1);
    Expr *ld = find_load(b0->expr, p->prog->inputs[0]);
    CHECK(ld && ld->index->kind == IX_ADD && ld->index->a[1]->kind == IX_VAR);
    Index *v = ld->index->a[1];
    CHECK(v->v == 1); /* the reduced variable is in scope */
    loop_passes(p, __LINE__);
    v->v = 2;
    loop_fails(p, "buf0 reads x at an index that uses v2, but its body has 2 loop variables",
               __LINE__);
    v->v = 1;
    /* buf1 (pointwise over [16, 32]) reading buf0 at v1 is fine; at v2 it is not */
    Expr *l1 = find_load(b1->expr, b0->id);
    CHECK(l1 && l1->index->kind == IX_VAR);
    int64_t keep = l1->index->v;
    l1->index->v = 2;
    loop_fails(p, "buf1 reads buf0 at an index that uses v2, but its body has 2 loop variables",
               __LINE__);
    l1->index->v = keep;
    loop_passes(p, __LINE__);
    plan_free(p);
}

TEST(check_loop_bad_ranges) {
    Plan *p = plan_of(SOFTMAX, NULL);
    CHECK(p);
    Buffer *b2 = buf_named(p, "buf2"), *b3 = buf_named(p, "buf3");
    CHECK(b2 && b3 && b2->nr == 1 && b3->np == 2);
    b3->size[1] = 0;
    loop_fails(p, "buf3 has range 0 for v1 (parallel); ranges must be >= 1", __LINE__);
    b3->size[1] = 1;
    loop_fails(p, "buf3 has range 1 for v1 (parallel); size-1 dims are dropped", __LINE__);
    b3->size[1] = 64;
    loop_fails(p, "buf3 iterates 1024 elements but holds 512", __LINE__);
    b3->size[1] = 32;
    b2->rsize[0] = -3;
    loop_fails(p, "buf2 has range -3 for v1 (reduced); ranges must be >= 1", __LINE__);
    b2->rsize[0] = 32;
    loop_passes(p, __LINE__);
    plan_free(p);
}

TEST(check_loop_ops_against_op_table) {
    Plan *p = plan_of(SOFTMAX, NULL);
    CHECK(p);
    Buffer *b1 = buf_named(p, "buf1"), *b3 = buf_named(p, "buf3");
    CHECK(b1 && b3);
    Expr *e = b1->expr; /* exp(sub(load x, load buf0)) */
    CHECK(e->kind == EX_OP && e->op == OP_EXP && e->args[0]->kind == EX_OP &&
          e->args[0]->op == OP_SUB);
    Expr *sub = e->args[0];
    sub->nargs = 1;
    loop_fails(p, "buf1 applies sub to 1 operands; ops.def gives it 2", __LINE__);
    sub->nargs = 2;
    sub->op = OP_SUM;
    loop_fails(p, "buf1 applies sum, which is not a pointwise op", __LINE__);
    sub->op = OP_SUB;
    /* a load's dtype is its buffer's */
    Expr *ld = find_load(b3->expr, b1->id);
    CHECK(ld && ld->dtype == KILN_F32);
    ld->dtype = KILN_BOOL;
    loop_fails(p, "buf3 loads buf1 as bool, but it holds f32", __LINE__);
    ld->dtype = KILN_F32;
    loop_passes(p, __LINE__);
    plan_free(p);
}

/* A pad's select: 0 <= v0 - 1 < 8 ? x(v0 - 1) : 0 over [10]. */
TEST(check_loop_select) {
    Plan *p = plan_of("input x: f32[8]\ny = sin(pad(x, [1, 1]))\noutput y\n", NULL);
    CHECK(p);
    Buffer *b0 = buf_named(p, "buf0");
    CHECK(b0 && b0->expr->kind == EX_OP && b0->expr->args[0]->kind == EX_SELECT);
    Expr *sel = b0->expr->args[0];
    int64_t lo = sel->lo, hi = sel->hi;
    CHECK(lo != EX_NOLO && hi != EX_NOHI);
    sel->lo = hi;
    loop_fails(p, "buf0 has a select whose range [8, 8) is empty", __LINE__);
    sel->lo = EX_NOLO;
    sel->hi = EX_NOHI;
    loop_fails(p, "buf0 has a select with no bound (it should have been folded)", __LINE__);
    sel->lo = lo;
    sel->hi = hi;
    loop_passes(p, __LINE__);
    plan_free(p);
}

/* relu((x + 1) @ w): x 0, w 1, buf0 2 (the add), buf1 3 (the matmul), buf2 4. */
static const char *EXTERN = "input x: f32[8, 16]\nweight w: f32[16, 4] = randn(7)\n"
                            "y = relu((x + 1) @ w)\noutput y\n";

TEST(check_loop_extern_operands) {
    Plan *p = plan_of(EXTERN, NULL);
    CHECK(p);
    Buffer *mm = buf_named(p, "buf1"), *b0 = buf_named(p, "buf0"), *b2 = buf_named(p, "buf2");
    CHECK(mm && b0 && b2 && mm->body == BODY_EXTERN && mm->nopnds == 2 &&
          mm->opnd[0].buf == b0->id);
    mm->opnd[0].buf = b2->id;
    loop_fails(p, "buf1 has extern operand buf2, which is computed later", __LINE__);
    mm->opnd[0].buf = b0->id;
    mm->opnd[0].offset = 1; /* one past the end at the last element */
    loop_fails(p, "buf1 reads buf0 at [1, 128] as extern operand 0, outside its 128 elements",
               __LINE__);
    mm->opnd[0].offset = 0;
    mm->nopnds = 1;
    loop_fails(p, "buf1 calls matmul with 1 operands", __LINE__);
    mm->nopnds = 2;
    loop_passes(p, __LINE__);
    plan_free(p);
}

TEST(check_loop_program_tables) {
    Plan *p = plan_of(EXTERN, NULL);
    CHECK(p);
    LoopProgram *lp = p->prog;
    Buffer *b2 = buf_named(p, "buf2");
    CHECK(b2 && lp->outputs[0] == b2->id && b2->is_output);
    b2->is_output = false;
    loop_fails(p, "program output 0 is buf2, which is not flagged is_output", __LINE__);
    b2->is_output = true;
    lp->ncomputed++;
    loop_fails(p, "program counts 4 computed buffers but has 3", __LINE__);
    lp->ncomputed--;
    const char *name = b2->name;
    b2->name = "buf7";
    loop_fails(p, "buf7 is computed buffer 2; it should be named buf2", __LINE__);
    b2->name = name;
    int in = lp->inputs[0];
    lp->inputs[0] = 1; /* w, a weight */
    loop_fails(p, "program input 0 is buffer id 1, not an input buffer", __LINE__);
    lp->inputs[0] = in;
    loop_passes(p, __LINE__);
    plan_free(p);
}

/* ===== sched_check: corrupted schedules fail, naming the kernel ======================= */

static void sched_fails(const Plan *p, const char *want, int line) {
    char err[512] = "";
    kiln_status st = sched_check(p->sched, err, sizeof err);
    char full[512];
    snprintf(full, sizeof full, "schedule check: %s", want);
    if (st != KILN_ERR_INPUT || strcmp(err, full))
        test_failf(__FILE__, line, "sched_check %d: '%s', want '%s'", (int)st, err, full);
}

static void sched_passes(const Plan *p, int line) {
    char err[512] = "";
    if (sched_check(p->sched, err, sizeof err) != KILN_OK)
        test_failf(__FILE__, line, "restored schedule fails: %s", err);
}

static void swap_kernels(Schedule *s, int a, int b) {
    Kernel t = s->kernels[a];
    s->kernels[a] = s->kernels[b];
    s->kernels[b] = t;
}

/* relu((x + 1) @ w): kernel 0 cpp_fused_add_0 (op0), kernel 1
 * extern_kernels.mm (op1 with its relu epilogue op2). */
TEST(check_sched_kernel_order) {
    Plan *p = plan_of(EXTERN, NULL);
    CHECK(p);
    Schedule *s = p->sched;
    CHECK(s->nkernels == 2 && !strcmp(s->kernels[0].kernel, "cpp_fused_add_0") &&
          !strcmp(s->kernels[1].kernel, "extern_kernels.mm") && s->kernels[1].n == 2);
    swap_kernels(s, 0, 1);
    sched_fails(p,
                "kernel 0 (extern_kernels.mm) reads buf0, which kernel 1 (cpp_fused_add_0) "
                "produces later",
                __LINE__);
    swap_kernels(s, 0, 1);
    /* what a later kernel reads must be stored */
    CHECK(s->kernels[0].store[0] == STORE_GLOBAL);
    s->kernels[0].store[0] = STORE_REGISTER;
    sched_fails(p,
                "kernel 1 (extern_kernels.mm) reads buf0, which kernel 0 (cpp_fused_add_0) "
                "keeps in a register",
                __LINE__);
    s->kernels[0].store[0] = STORE_GLOBAL;
    sched_passes(p, __LINE__);
    plan_free(p);
}

TEST(check_sched_membership) {
    Plan *p = plan_of(EXTERN, NULL);
    CHECK(p);
    Schedule *s = p->sched;
    Kernel *k1 = &s->kernels[1];
    CHECK(k1->n == 2 && k1->members[0] == 1 && k1->members[1] == 2);
    /* a fused kernel of 2 under max_fusion_size 1 */
    s->cfg.max_fusion_size = 1;
    sched_fails(p, "kernel 1 (extern_kernels.mm) has 2 members, more than max_fusion_size 1",
                __LINE__);
    s->cfg.max_fusion_size = kiln_config_default().max_fusion_size;
    /* op2 dropped from its kernel: in none */
    k1->n = 1;
    sched_fails(p, "kernel 1 (extern_kernels.mm) is named op1_op2, not after its members",
                __LINE__);
    const char *name = k1->name;
    k1->name = "op1";
    sched_fails(p, "op2 is in no kernel", __LINE__);
    k1->name = name;
    k1->n = 2;
    /* op0 in two kernels */
    k1->members[0] = 0;
    sched_fails(p,
                "op0 is a member of kernel 0 (cpp_fused_add_0) and kernel 1 "
                "(extern_kernels.mm)",
                __LINE__);
    k1->members[0] = 1;
    k1->members[1] = 0;
    sched_fails(p, "kernel 1 (extern_kernels.mm) has member 0 out of range or order", __LINE__);
    k1->members[1] = 2;
    sched_passes(p, __LINE__);
    plan_free(p);
}

TEST(check_sched_kinds) {
    Plan *p = plan_of(EXTERN, NULL);
    CHECK(p);
    Schedule *s = p->sched;
    Kernel *k1 = &s->kernels[1];
    k1->kind = KK_POINTWISE;
    sched_fails(p,
                "kernel 1 (extern_kernels.mm) is a pointwise kernel with 0 loop nests; its "
                "members make it extern",
                __LINE__);
    k1->kind = KK_EXTERN;
    /* the relu epilogue must iterate the extern's output */
    SNode *op2 = &s->nodes[2];
    CHECK(op2->np == 2 && op2->P[1] == 4);
    op2->P[1] = 5;
    op2->numel = 40;
    sched_fails(p, "kernel 1 (extern_kernels.mm): op2 does not iterate its loops", __LINE__);
    op2->P[1] = 4;
    op2->numel = 32;
    sched_passes(p, __LINE__);
    plan_free(p);
}

/* softmax: one reduction kernel op0_op1_op2_op3 of three stages (amax; exp
 * and sum; div). */
TEST(check_sched_stages) {
    Plan *p = plan_of(SOFTMAX, NULL);
    CHECK(p);
    Schedule *s = p->sched;
    CHECK(s->nkernels == 1 && s->kernels[0].n == 4 && s->kernels[0].nstages == 3);
    Kernel *k = &s->kernels[0];
    CHECK(k->stage[0] == 0 && k->stage[1] == 1 && k->stage[2] == 1 && k->stage[3] == 2);
    k->stage[3] = 1; /* the div in the loop that computes the sum */
    sched_fails(p,
                "kernel 0 (cpp_fused_softmax_0): op3 at stage 1 reads buf2, computed at "
                "stage 1 by op2",
                __LINE__);
    k->stage[3] = 3;
    sched_fails(p, "kernel 0 (cpp_fused_softmax_0): op3 is at stage 3 of 3", __LINE__);
    k->stage[3] = 2;
    k->kind = KK_POINTWISE;
    sched_fails(p,
                "kernel 0 (cpp_fused_softmax_0) is a pointwise kernel with 1 loop nests; its "
                "members make it reduction",
                __LINE__);
    k->kind = KK_REDUCTION;
    sched_passes(p, __LINE__);
    plan_free(p);
}

TEST(check_sched_nodes) {
    Plan *p = plan_of(SOFTMAX, NULL);
    CHECK(p);
    Schedule *s = p->sched;
    SNode *op1 = &s->nodes[1]; /* exp(x - buf0): reads x, buf0; writes buf1 */
    int r = -1;
    for (int d = 0; d < op1->ndeps; d++)
        if (!op1->deps[d].write && s->node_of_buf[op1->deps[d].buf] == 0) r = d;
    CHECK(r >= 0);
    int keep = op1->deps[r].buf;
    op1->deps[r].buf = s->nodes[3].buf;
    sched_fails(p, "op1 reads buf3, which op3 computes later", __LINE__);
    op1->deps[r].buf = keep;
    op1->deps[op1->ndeps - 1].write = false;
    sched_fails(p, "op1 has a read as dep 2 of 3 (its write must be the last, and only it)",
                __LINE__);
    op1->deps[op1->ndeps - 1].write = true;
    int b = s->node_of_buf[op1->buf];
    s->node_of_buf[op1->buf] = 2;
    sched_fails(p, "buf1 maps to node 2", __LINE__);
    s->node_of_buf[op1->buf] = b;
    sched_passes(p, __LINE__);
    plan_free(p);
}

TEST(check_sched_traffic_and_log) {
    Plan *p = plan_of(EXTERN, NULL);
    CHECK(p);
    Schedule *s = p->sched;
    int64_t lb = s->kernels[0].load_bytes;
    s->kernels[0].load_bytes = -1;
    sched_fails(p, "kernel 0 (cpp_fused_add_0) loads -1 bytes and stores 512", __LINE__);
    s->kernels[0].load_bytes = lb;
    s->fused_bytes += 4;
    char want[200];
    snprintf(want, sizeof want, "fused traffic is %lld bytes, but its kernels move %lld",
             (long long)s->fused_bytes, (long long)s->fused_bytes - 4);
    sched_fails(p, want, __LINE__);
    s->fused_bytes -= 4;
    /* the log names fused nodes: find the fusion of op1 with op2 */
    int f = -1;
    for (int i = 0; i < s->nevents; i++)
        if (s->events[i].kind == EV_FUSE) f = i;
    CHECK(f >= 0 && !strcmp(s->events[f].a, "op1") && !strcmp(s->events[f].b, "op2"));
    s->events[f].b = "op9";
    snprintf(want, sizeof want, "event %d (round 1) names op1 and op9", f);
    sched_fails(p, want, __LINE__);
    s->events[f].b = "op2_op1";
    snprintf(want, sizeof want, "event %d (round 1) names op1 and op2_op1", f);
    sched_fails(p, want, __LINE__);
    s->events[f].b = "op2";
    s->rounds[0].nfused++;
    sched_fails(p, "round 1 fused 2 pairs of 3 nodes into 2 (the last left 3)", __LINE__);
    s->rounds[0].nfused--;
    sched_passes(p, __LINE__);
    plan_free(p);
}
