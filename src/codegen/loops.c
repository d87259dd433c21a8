/*
 * loops.c -- a kernel's loop structure and its text. Adjacent dims are
 * merged into one loop when every index in the kernel walks them as one (a
 * contiguous [64, 1024] is one loop of 65536); the strategies then reshape
 * the nest (outer.c, tiles.c, pairs.c); the outermost loops run under
 * `#pragma omp parallel for` when the kernel is big enough
 * (CG_PARALLEL_MIN), collapsed until they give CG_PARALLEL_ITERS
 * iterations. The innermost loop of each nest carries `#pragma omp simd`
 * and CG_INNER_MARK on its `for` line, so a test can match it with GCC's
 * vectorization report.
 */
#include "codegen/codegen.h"
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Dims d and d+1 can share one loop when every index of the kernel walks
 * them as one: coef[d] == coef[d+1] * size[d+1] (both 0 included). */
typedef struct {
    KGen *K;
    int nvars;
    bool ok[MAXL];
} MergeCheck;

static void check_index(MergeCheck *m, const Index *ix) {
    int64_t coef[MAXL], off;
    uint32_t vs = ix_vars(ix);
    bool affine = ix_affine(ix, m->nvars, coef, &off);
    for (int d = 0; d + 1 < m->nvars; d++) {
        bool uses = (vs >> d) & 3u;
        if (!uses) continue;
        if (!affine || coef[d] != coef[d + 1] * m->K->size[d + 1]) m->ok[d] = false;
    }
}

static void check_load(const Expr *e, void *ud) { check_index(ud, e->index); }

static void plan_merges(KGen *K, bool *ok) {
    MergeCheck m = {.K = K};
    for (int d = 0; d < MAXL; d++) m.ok[d] = true;
    for (int i = 0; i < K->k->n; i++) {
        const SNode *n = snode(K->g, K->k->members[i]);
        const Buffer *b = member_buf(K, i);
        m.nvars = cg_member_vars(n);
        if (b->expr) ex_loads(b->expr, check_load, &m);
        if (b->expr) ex_selects(b->expr, check_load, &m);
        check_index(&m, cg_store_index(K, n->np, n->P));
    }
    for (int d = 0; d + 1 < K->ndims; d++)
        ok[d] = m.ok[d] && d + 1 != K->npd; /* never merge across P / R */
}

int cg_new_loop(KGen *K, const char *name, int64_t extent) {
    K->loop[K->nloops] = (Loop){name, extent, NULL, NULL, 1};
    return K->nloops++;
}

/* One loop per group of merged dims: the row nest runs the P groups, rl
 * the R groups. */
static void build_loops(KGen *K) {
    bool ok[MAXL] = {false};
    plan_merges(K, ok);
    if (K->epi.on) cg_epilogue_merges(K->ndims, ok);
    for (int d = 0; d < K->ndims; d++) {
        if (!(d > 0 && ok[d - 1])) {
            bool red = d >= K->npd;
            int L = cg_new_loop(
                K, pool_printf(K->g->pool, "%s%d", red ? "r" : "x", red ? K->nrl : K->npl), 1);
            if (red)
                K->rl[K->nrl++] = L;
            else
                K->pnest[K->npl++] = L;
        }
        K->loop_of[d] = K->nloops - 1;
        K->loop[K->nloops - 1].extent *= K->size[d];
    }
    for (int d = K->ndims - 1; d >= 0; d--)
        K->div[d] = d + 1 < K->ndims && K->loop_of[d + 1] == K->loop_of[d]
                        ? K->div[d + 1] * K->size[d + 1]
                        : 1;
}

/* Split loop L into a loop over blocks of `block` (returned) and L over one
 * block: `for (xb = 0; xb < n; xb += block)` around
 * `for (x = xb; x < min(xb + block, n); x++)`. */
int cg_split_loop(KGen *K, int L, int64_t block) {
    int64_t n = K->loop[L].extent;
    if (block > n) block = n;
    int b = cg_new_loop(K, pool_printf(K->g->pool, "%sb", K->loop[L].name), n);
    K->loop[b].step = block;
    const char *bn = K->loop[b].name;
    K->loop[L].lo = bn;
    K->loop[L].hi = block == n ? pool_printf(K->g->pool, "%lld", (long long)n)
                               : pool_printf(K->g->pool, "(%s + %lld < %lld ? %s + %lld : %lld)",
                                             bn, (long long)block, (long long)n, bn,
                                             (long long)block, (long long)n);
    return b;
}

/* A kernel's work per element of its loops, in units of one float
 * streamed: 1, plus a quarter for each op its members compute (a 13x13
 * max pool's 168 maxima make a small plane worth the threads). */
static int64_t work_factor(const KGen *K) {
    int64_t ops = 0;
    for (int i = 0; i < K->k->n; i++) {
        const Buffer *b = member_buf(K, i);
        if (b->expr) ops += ex_nops(b->expr);
    }
    return 1 + ops / 4;
}

/* How many outer loops OpenMP shares out (0: the kernel runs serially):
 * none below CG_PARALLEL_MIN of work. */
static void plan_parallel(KGen *K) {
    int64_t work = K->k->numel * (K->k->rnumel > 0 ? K->k->rnumel : 1) * work_factor(K);
    if (work < CG_PARALLEL_MIN) return;
    int avail = K->k->kind == KK_POINTWISE && K->npl > 1 ? K->npl - 1 : K->npl;
    int64_t iters = 1;
    for (int j = 0; j < avail && iters < CG_PARALLEL_ITERS; j++) {
        const Loop *L = &K->loop[K->pnest[j]];
        if (L->lo) break; /* inside a block: not a rectangular nest */
        iters *= (L->extent + L->step - 1) / L->step;
        K->collapse = j + 1;
    }
    if (iters < 2) K->collapse = 0;
    /* a whole-tensor reduction has no row loop: its reduced loop is shared
     * out instead, each thread with partial accumulators */
    if (K->k->kind == KK_REDUCTION && K->npl == 0 && K->nrl > 0) K->full_par = true;
}

static bool sizes_are(int n, const int64_t *a, int m, const int64_t *b) {
    return n == m && !memcmp(a, b, sizeof(int64_t) * (size_t)n);
}

/* Every member iterates the kernel's dims, as the scheduler guarantees: a
 * reduction P x R, a pointwise member P ++ R (inner) or P (row step). Member
 * variable v_i is then kernel dim i. */
static void check_members(KGen *K) {
    const Kernel *k = K->k;
    for (int i = 0; i < k->n; i++) {
        const SNode *n = snode(K->g, k->members[i]);
        bool same = n->body == BODY_REDUCTION
                        ? sizes_are(n->np, n->P, k->np, k->P) && sizes_are(n->nr, n->R, k->nr, k->R)
                        : sizes_are(n->np, n->P, K->ndims, K->size) ||
                              (k->kind == KK_REDUCTION && sizes_are(n->np, n->P, k->np, k->P));
        if (!same) cg_fail(K->g, "codegen: member %s of %s has other loops", n->name, k->kernel);
    }
}

/* Open the row nest and a stage nest: set each open loop's level. */
void cg_open_nest(KGen *K, const int *ids, int n) {
    for (int L = 0; L < K->nloops; L++) K->level_of[L] = -1;
    for (int j = 0; j < K->npl; j++) K->level_of[K->pnest[j]] = j + 1;
    K->nsn = n;
    for (int j = 0; j < n; j++) {
        K->snest[j] = ids[j];
        K->level_of[ids[j]] = K->npl + 1 + j;
    }
    K->inner = K->npl + n;
    K->innermost = n ? ids[n - 1] : K->npl ? K->pnest[K->npl - 1] : -1;
}

/* A kernel that computes or stores an f64 value runs plain loops: the
 * strategies that reshape them (outer reductions, tiles, streamed stores,
 * row pairs, lanes, row prefetch) are written for floats, and f64 math is
 * libm's scalar code anyway. A float kernel that only reads an f64 value
 * through a cast (an ONNX int64 mask made a float) keeps them; its f64
 * loads are not prefetched (emit_load). */
static bool kernel_f64(const KGen *K) {
    for (int i = 0; i < K->k->n; i++) {
        const Buffer *b = member_buf(K, i);
        /* loads aside: an f64 load a cast turns into a float computes nothing in f64 */
        if (b->dtype == KILN_F64 || (b->expr && ex_has_f64(b->expr, false))) return true;
    }
    return false;
}

void cg_setup_kernel(KGen *K) {
    const Kernel *k = K->k;
    K->npd = k->np;
    K->ndims = k->np + k->nr;
    K->outer.xin = -1;
    K->rp.n = 1;
    K->rp.sfx = "";
    if (K->ndims > MAXL) cg_fail(K->g, "codegen: %s has %d dims", k->kernel, K->ndims);
    memcpy(K->size, k->P, sizeof(int64_t) * (size_t)k->np);
    memcpy(K->size + k->np, k->R, sizeof(int64_t) * (size_t)k->nr);
    for (int l = 0; l <= MAXL; l++) str_init(&K->block[l], K->g->pool);
    str_init(&K->clauses, K->g->pool);
    str_init(&K->post, K->g->pool);
    str_init(&K->st.post, K->g->pool);
    str_init(&K->st.vpost, K->g->pool);
    K->st.vloop = -1;
    K->use = pool_alloc(K->g->pool, (size_t)K->g->p->nbufs + 1);
    K->outer.members = pool_alloc(K->g->pool, sizeof(int) * (size_t)(k->n + 1));
    check_members(K);
    K->f64 = kernel_f64(K);
    build_loops(K);
    cg_open_nest(K, NULL, 0);
    if (K->epi.on)
        cg_epilogue_bounds(K); /* serial: the library shares blocks out */
    else if (K->f64)
        ; /* plain loops (kernel_f64) */
    else if (cg_want_outer(K))
        cg_make_outer(K);
    else if (cg_want_tiles(K))
        cg_make_tiles(K);
    if (!K->f64) cg_plan_stream(K);
    if (!K->f64 && cg_want_pairs(K)) cg_make_pairs(K);
    if (!K->epi.on) plan_parallel(K);
    cg_open_nest(K, NULL, 0);
}

bool cg_is_parallel(const KGen *K) { return K->collapse > 0 || K->full_par; }

bool cg_has_scratch_region(const KGen *K) { return K->nscratch > 0 && K->collapse > 0; }

/* 8-wide vectors for an inner loop of constant trip count n where 16-wide
 * ones would leave a long scalar remainder: n / 16 vector steps and n % 16
 * scalar ones, against n / 8 and n % 8 (GCC 12 does not mask the remainder
 * of an AVX-512 loop). Rows of 14, 28 and 56 (CNN planes) run wholly in
 * vectors then. Such a loop also gets `omp simd` when its strided loads
 * are all near (2 to 4 apart), which GCC vectorizes with permutes; other
 * strided loops are left to GCC's cost model (gathers). Without it a max
 * pool over rows of 56 ran its remainder scalar (docs/decisions.md: 8-wide
 * vectors for short rows). Elsewhere (no AVX-512) 8 floats are the widest
 * vector anyway. */
static bool want_simd8(const Loop *l) {
    int64_t n = l->extent;
    return !l->lo && !l->hi && l->step == 1 && n / 8 + n % 8 < n / 16 + n % 16;
}

/* Does loop j of the row nest (row_nest) or of a stage nest start the
 * kernel's parallel region? It is written `#pragma omp parallel` around
 * `#pragma omp for ... nowait` (the region's end is the barrier), so that
 * each thread can tell the profiler when its share starts and ends
 * (KILN_TPROF). A kernel with scratch rows opens its region itself
 * (region_text), and an extern's epilogue runs on the library's threads. */
static bool opens_region(const KGen *K, bool row_nest, int j) {
    if (j != 0 || K->epi.on) return false;
    if (row_nest) return K->collapse > 0 && !cg_has_scratch_region(K);
    return K->full_par;
}

int cg_kernel_index(const KGen *K) { return (int)(K->k - K->g->s->kernels); }

/* Pragmas of loop j (loop L) of a nest (row nest or stage nest) of n loops;
 * force: `omp simd` whatever the loop (see nest_text). Inside a region
 * (opens_region) the worksharing loop is `omp for ... nowait`. */
static void loop_pragmas(KGen *K, Str *o, bool row_nest, int j, int n, int L, bool innermost,
                         int ind, bool force) {
    const char *wait = opens_region(K, row_nest, j) ? " nowait" : "";
    bool simd8 = innermost && want_simd8(&K->loop[L]);
    bool simd =
        force || (innermost && (K->has_red || !K->strided || (simd8 && !K->far) || K->guarded));
    const char *cl = str_get(&K->clauses), *len = simd8 ? " simdlen(8)" : "";
    if (row_nest && j == 0 && K->collapse > 0) {
        bool with_simd = simd && K->collapse == 1 && j == n - 1;
        str_putf(o, "%*s#pragma omp for", ind, "");
        if (K->collapse > 1) str_putf(o, " collapse(%d)", K->collapse);
        str_putf(o, "%s%s\n", with_simd ? " simd" : "", wait);
        if (with_simd) return;
    }
    if (!row_nest && j == 0 && K->full_par) {
        str_putf(o, "%*s#pragma omp for%s%s%s\n", ind, "", innermost ? " simd" : "", cl, wait);
        return;
    }
    if (simd) str_putf(o, "%*s#pragma omp simd%s%s\n", ind, "", len, cl);
}

static void loop_header(KGen *K, Str *o, int L, bool innermost, int ind) {
    const Loop *l = &K->loop[L];
    str_putf(o, "%*sfor (int64_t %s = %s; %s < ", ind, "", l->name, l->lo ? l->lo : "0", l->name);
    if (l->hi)
        str_putf(o, "%s", l->hi);
    else
        str_putf(o, "%lld", (long long)l->extent);
    if (l->step == 1)
        str_putf(o, "; %s++) {", l->name);
    else
        str_putf(o, "; %s += %lld) {", l->name, (long long)l->step);
    str_putf(o, "%s\n", innermost ? "  " CG_INNER_MARK : "");
    K->inner_loops += innermost;
}

/* Loops ids[j..n-1] of a nest whose first body is level level0 + 1, around
 * their bodies, at indentation ind. row_guard opens the row level's body.
 * A reduction whose stages run no loops of their own (every reduced extent
 * is 1) has its guarded loads in the row nest's last loop, and that loop
 * gets `omp simd` as an innermost one would (see emit_branch): without it
 * GCC 12 -O3 vectorized such a nest wrongly too (fuzz-diff seed
 * 1796004187422012: layer_norm over a dim of 1 of a concat; reduced in
 * tests/test_fused.c, fused_guarded_outer_loop). */
void cg_nest_text(KGen *K, Str *o, bool row_nest, const int *ids, int j, int n, int level0, int ind,
                  const char *row_guard) {
    if (j == n) return;
    bool innermost = j == n - 1 && (!row_nest || K->k->kind == KK_POINTWISE);
    bool row_simd = row_nest && j == n - 1 && !innermost && K->row_guarded && K->stage_loops == 0 &&
                    (j >= K->collapse || K->collapse == 1); /* not inside collapse(2+) */
    int level = level0 + j + 1;
    Loop *l = &K->loop[ids[j]];
    /* a row stage's streamed stores per vector (stream_store): the loop in
     * groups of CG_LANES, each stored out as soon as computed */
    bool vgroup = !row_nest && innermost && K->st.vloop == ids[j] && !l->lo && !l->hi &&
                  l->step == 1 && !K->full_par && !str_get(&K->clauses)[0];
    const char *g = vgroup ? pool_printf(K->g->pool, "%sv", l->name) : NULL;
    if (vgroup) {
        str_putf(o, "%*sfor (int64_t %s = 0; %s < %lld; %s += %d) {\n", ind, "", g, g,
                 (long long)l->extent, g, CG_LANES);
        l->lo = g;
        l->hi = pool_printf(K->g->pool, "%s + %d", g, CG_LANES);
        ind += 4;
    }
    bool region = opens_region(K, row_nest, j);
    if (region) {
        str_putf(o, "%*s#pragma omp parallel\n%*s{\n", ind, "", ind, "");
        ind += 4;
        str_putf(o, "%*sKILN_TPROF(%d, KILN_PROF_THREAD_BEGIN);\n", ind, "", cg_kernel_index(K));
    }
    loop_pragmas(K, o, row_nest, j, n, ids[j], innermost, ind, row_simd);
    loop_header(K, o, ids[j], innermost, ind);
    if (row_nest && level == K->npl && row_guard) cg_put_indented(o, row_guard, ind + 4);
    cg_put_indented(o, str_get(&K->block[level]), ind + 4);
    cg_nest_text(K, o, row_nest, ids, j + 1, n, level0, ind + 4, row_guard);
    str_putf(o, "%*s}\n", ind, "");
    if (region) {
        str_putf(o, "%*sKILN_TPROF(%d, KILN_PROF_THREAD_END);\n", ind, "", cg_kernel_index(K));
        ind -= 4;
        str_putf(o, "%*s}\n", ind, "");
    }
    if (innermost && row_nest && K->st.on) cg_put_indented(o, str_get(&K->post), ind);
    if (vgroup) {
        cg_put_indented(o, str_get(&K->st.vpost), ind);
        str_putf(o, "%*s}\n", ind - 4, "");
        l->lo = l->hi = NULL;
        K->st.vdone = true;
    }
}
