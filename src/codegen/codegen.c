/*
 * codegen.c -- a schedule becomes one C source.   requires: a Schedule;
 * gives: C text that the JIT compiles, and each call's buffers for the
 * memory planner.
 *
 * The source is self-contained: a prelude (prelude.c), one static function
 * per generated kernel, and kiln_entry calling the kernels and the extern
 * kernels in the schedule's order (calls.c). A kernel is a loop nest
 * (loops.c). A pointwise kernel loops over its iteration sizes; a
 * reduction kernel has one outer loop nest over the parallel dims (the
 * row) holding its stages in order: an inner loop nest over the reduced
 * dims, or a per-row scalar step (this file: stages, the function around
 * them, the driver). Each member's expression becomes C text in emit.c.
 *
 * Strategies that change a kernel's shape, each in its file with its state
 * in KGen: outer reduction (outer.c), tiles for transposes (tiles.c), row
 * pairs (pairs.c), streamed stores (stream.c), row prefetch and lanes
 * (prefetch.c), extern epilogues (epilogue.c).
 *
 * Errors: internal limits and pool exhaustion longjmp to cg_generate, which
 * returns a status and a message; nothing is printed.
 */
#include "codegen/codegen.h"
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void cg_fail(Gen *g, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (g->errlen) vsnprintf(g->err, g->errlen, fmt, ap);
    va_end(ap);
    longjmp(g->jb, 2);
}

static void name_buffers(Gen *g) {
    const LoopProgram *p = g->p;
    g->bufname = pool_alloc(g->pool, sizeof(char *) * (size_t)(p->nbufs + 1));
    for (int b = 0; b < p->nbufs; b++) {
        const Buffer *B = p->bufs[b];
        const char *n = B->body == BODY_INPUT    ? cg_c_ident(g->pool, "in_", B->name)
                        : B->body == BODY_WEIGHT ? cg_c_ident(g->pool, "w_", B->name)
                                                 : cg_c_ident(g->pool, "", B->name);
        for (int o = 0; o < b; o++)
            if (!strcmp(g->bufname[o], n)) n = pool_printf(g->pool, "%s_%d", n, b);
        g->bufname[b] = n;
    }
}

/* A stage's loops ids[0..n) open, with no strided load or reduction seen
 * yet. */
void cg_open_stage(KGen *K, const int *ids, int n) {
    cg_open_nest(K, ids, n);
    K->strided = false;
    K->far = false;
    K->guarded = false;
    K->has_red = false;
}

/* An inner stage runs the reduced loops (and, in an outer reduction, the
 * moved parallel loop below them); a row step runs nothing, or the moved
 * loop. */
void cg_begin_stage(KGen *K, StageKind kind) {
    int ids[MAXL + 1], n = 0;
    if (kind == STAGE_INNER && K->k->kind == KK_REDUCTION)
        for (int j = 0; j < K->nrl; j++) ids[n++] = K->rl[j];
    if (K->outer.xin >= 0) ids[n++] = K->outer.xin;
    cg_open_stage(K, ids, n);
}

/* Close a stage: its loops go into the row body, its values die. */
void cg_end_stage(KGen *K) {
    K->lane.index = NULL;
    K->stage_loops += K->nsn > 0;
    K->row_guarded |= K->nsn == 0 && K->guarded;
    if (K->nsn > 0) {
        cg_nest_text(K, &K->block[K->npl], false, K->snest, 0, K->nsn, K->npl, 0, NULL);
        for (int l = K->npl + 1; l <= K->npl + K->nsn; l++) {
            str_init(&K->block[l], K->g->pool);
            K->epoch[l]++;
        }
    }
    if (!K->st.vdone) cg_put_indented(&K->block[K->npl], str_get(&K->st.post), 0);
    cg_put_indented(&K->block[K->npl], str_get(&K->post), 0);
    str_init(&K->post, K->g->pool);
    str_init(&K->st.post, K->g->pool);
    str_init(&K->st.vpost, K->g->pool);
    K->st.vloop = -1;
    K->st.vdone = false;
    str_init(&K->clauses, K->g->pool);
    cg_open_nest(K, NULL, 0);
}

void cg_gen_stages(KGen *K) {
    const Kernel *k = K->k;
    if (k->kind == KK_POINTWISE) {
        cg_begin_stage(K, STAGE_INNER);
        for (int i = 0; i < k->n; i++) cg_gen_member(K, i);
        for (int i = 0; K->st.prefetch && i < K->pf.n; i++) /* the tile loop's body */
            cg_line(K, K->npl - 1, "%s", K->pf.addr[i]);
        K->pf.n = 0;
        return; /* the loops are assembled with the function */
    }
    if (K->outer.xin >= 0) {
        cg_gen_outer_stages(K);
        return;
    }
    int inner = 0;
    for (int st = 0; st < k->nstages; st++) inner += k->stage_kind[st] == STAGE_INNER;
    const Loop *row = K->npl ? &K->loop[K->pnest[K->npl - 1]] : NULL;
    bool pf = inner >= 2 && row && !row->lo && row->step == 1 && row->extent > 1 && K->rp.n == 1 &&
              !K->epi.on && !K->f64 && k->stage_kind[0] == STAGE_INNER &&
              row->extent * k->rnumel * (int64_t)sizeof(float) >= CG_ROW_PF_MIN;
    int seen = 0;
    for (int st = 0; st < k->nstages; st++) {
        cg_begin_stage(K, k->stage_kind[st]);
        int blk = -1;
        if (k->stage_kind[st] == STAGE_INNER && seen++ == 1 && pf && K->pf.n) {
            blk = cg_spread_stage(K, st);
            cg_row_prefetch(K, K->rl[0], blk);
        }
        K->pf.record = pf && st == 0 && K->nsn == 1 && !K->loop[K->innermost].lo;
        for (int p = 0; p < K->rp.n; p++) {
            cg_pair_row(K, p);
            for (int i = 0; i < k->n; i++)
                if (k->stage[i] == st) cg_gen_member(K, i);
        }
        cg_pair_row(K, 0);
        cg_end_stage(K);
        if (blk >= 0) K->loop[K->rl[0]].lo = K->loop[K->rl[0]].hi = NULL; /* whole again */
    }
}

static void kernel_comment(KGen *K, Str *o) {
    const Kernel *k = K->k;
    Gen *g = K->g;
    str_putf(o, "/*\n * %s: %s over [", k->kernel, kernel_kind_name[k->kind]);
    for (int d = 0; d < k->np; d++) str_putf(o, "%s%lld", d ? ", " : "", (long long)k->P[d]);
    str_putf(o, "]");
    if (k->kind == KK_REDUCTION) {
        str_putf(o, " x reduced [");
        for (int d = 0; d < k->nr; d++) str_putf(o, "%s%lld", d ? ", " : "", (long long)k->R[d]);
        str_putf(o, "], %d stage%s", k->nstages, k->nstages == 1 ? "" : "s");
    }
    if (K->outer.xin >= 0)
        str_putf(o, ", outer reduction (blocks of %lld)",
                 (long long)K->loop[K->pnest[K->npl - 1]].step);
    if (K->rp.n == 2) str_putf(o, ", row pairs");
    if (K->f64) str_putf(o, ", f64 (plain loops)");
    str_putf(o, "%s\n * origins:", cg_is_parallel(K) ? ", parallel" : "");
    for (int i = 0; i < k->norigins; i++) str_putf(o, " %s", k->origins[i]);
    str_putf(o, "\n");
    for (int i = 0; i < k->n; i++) {
        const Buffer *b = member_buf(K, i);
        str_putf(o, " *   %s -> %s: %s", snode(g, k->members[i])->name, g->bufname[b->id],
                 b->body == BODY_REDUCTION ? rop_name[b->rop]
                 : b->body == BODY_RAND    ? "rand"
                                           : "pointwise");
        if (k->kind == KK_REDUCTION)
            str_putf(o, ", stage %d (%s)", k->stage[i],
                     k->stage_kind[k->stage[i]] == STAGE_INNER ? "inner" : "row");
        str_putf(o, ", %s\n", store_name[k->store[i]]);
    }
    str_putf(o, " */\n");
}

static void signature(KGen *K, Str *o, bool returns_int) {
    Gen *g = K->g;
    Str sig;
    str_init(&sig, g->pool);
    str_putf(&sig, "KILN_FN %s %s%s(", returns_int ? "int" : "void", g->prefix, K->k->kernel);
    bool first = true;
    for (int b = 0; b < g->p->nbufs; b++) {
        if (!K->use[b]) continue;
        str_putf(&sig, "%s%s%s *restrict %s", first ? "" : ", ",
                 K->use[b] & USE_WRITE ? "" : "const ",
                 g->p->bufs[b]->dtype == KILN_F64 ? "double" : "float", g->bufname[b]);
        first = false;
    }
    str_putf(&sig, "%s)", first ? "void" : "");
    str_putf(o, "%s\n", str_get(&sig));
    str_putf(&g->protos, "%s;\n", str_get(&sig));
}

static bool scratch_on_stack(const Scratch *s) {
    return s->n * (int64_t)(s->f64 ? sizeof(double) : sizeof(float)) <= CG_STACK_SCRATCH;
}

static bool needs_malloc(const KGen *K) {
    for (int i = 0; i < K->nscratch; i++)
        if (!scratch_on_stack(&K->scratch[i])) return true;
    return false;
}

static void scratch_frees(KGen *K, Str *o, int ind) {
    for (int i = 0; i < K->nscratch; i++)
        if (!scratch_on_stack(&K->scratch[i]))
            str_putf(o, "%*sfree(%s);\n", ind, "", K->scratch[i].name);
}

/* Scratch rows: on the stack, or malloc'd; all allocations are made before
 * any is checked, so a failure frees what it got. */
void cg_scratch_decls(KGen *K, Str *o, int ind, bool in_region) {
    Str any;
    str_init(&any, K->g->pool);
    for (int i = 0; i < K->nscratch; i++) {
        const Scratch *s = &K->scratch[i];
        const char *ty = s->f64 ? "double" : "float";
        if (scratch_on_stack(s)) {
            str_putf(o, "%*s%s %s[%lld];\n", ind, "", ty, s->name, (long long)s->n);
            continue;
        }
        str_putf(o, "%*s%s *%s = malloc(%lld * sizeof(%s));\n", ind, "", ty, s->name,
                 (long long)s->n, ty);
        str_putf(&any, "%s!%s", any.n ? " || " : "", s->name);
    }
    if (!any.n) return;
    str_putf(o, "%*sif (%s) {\n", ind, "", str_get(&any));
    if (in_region) {
        str_putf(o, "%*s#pragma omp atomic write\n%*sfailed = 1;\n", ind + 4, "", ind + 4, "");
    } else {
        scratch_frees(K, o, ind + 4);
        str_putf(o, "%*sreturn 1;\n", ind + 4, "");
    }
    str_putf(o, "%*s}\n", ind, "");
}

/* The row loop nest inside an explicit parallel region: each thread
 * allocates its scratch rows once; a thread without them skips its rows and
 * the kernel reports the failure. */
static void region_text(KGen *K, Str *o) {
    bool mal = needs_malloc(K);
    if (mal) str_putf(o, "    int failed = 0;\n");
    str_putf(o, "    #pragma omp parallel\n    {\n");
    str_putf(o, "        KILN_TPROF(%d, KILN_PROF_THREAD_BEGIN);\n", cg_kernel_index(K));
    cg_scratch_decls(K, o, 8, true);
    Str guard;
    str_init(&guard, K->g->pool);
    for (int i = 0; i < K->nscratch; i++)
        if (!scratch_on_stack(&K->scratch[i]))
            str_putf(&guard, "if (!%s) continue;   /* this thread has no scratch (reported) */\n",
                     K->scratch[i].name);
    cg_nest_text(K, o, true, K->pnest, 0, K->npl, 0, 8, mal ? str_get(&guard) : NULL);
    if (K->st.used) str_putf(o, "        kiln_stream_fence();\n");
    scratch_frees(K, o, 8);
    str_putf(o, "        KILN_TPROF(%d, KILN_PROF_THREAD_END);\n", cg_kernel_index(K));
    str_putf(o, "    }\n");
    if (mal) str_putf(o, "    return failed;\n");
}

/* ---- the outer loop split where guards change ----
 *
 * A concat (or pad) along the kernel's first dim guards its loads with
 * tests of that dim's variable (`int c1 = x0 < 17;` ... `c1 ? x[i] :
 * 0.0f`). Every guard is evaluated, and every guarded load issued
 * (masked), at every element, whichever input the element comes from: a
 * BiLSTM's output, a concat of its 40 step outputs, ran 40 masked loads
 * per element. A serial kernel whose first loop is that dim alone runs
 * the loop as consecutive loops over the ranges between the points where
 * such a test changes, each with the same body: within a range GCC knows
 * every such test's value (from the loop's bounds) and drops the loads
 * that are not taken. Any split gives the same results; the points only
 * decide how many loads are left. */
#define SPLIT_MAX 64

typedef struct {
    int nvars, var; /* the member's vars; the one split */
    int64_t extent;
    int64_t at[SPLIT_MAX];
    int n;
    bool over; /* more points than SPLIT_MAX */
} Splits;

static void split_add(Splits *sp, int64_t x) {
    if (x <= 0 || x >= sp->extent) return;
    for (int i = 0; i < sp->n; i++)
        if (sp->at[i] == x) return;
    if (sp->n == SPLIT_MAX) {
        sp->over = true;
        return;
    }
    sp->at[sp->n++] = x;
}

static int64_t floor_div(int64_t a, int64_t b) {
    int64_t q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

/* The first x0 at which c x0 + off >= bound holds (c > 0) or stops
 * holding (c < 0). */
static int64_t crossing(int64_t c, int64_t off, int64_t bound) {
    return c > 0 ? -floor_div(-(bound - off), c) : floor_div(bound - off, c) + 1;
}

/* The points where a select on var sp->var alone changes its test. */
static void split_select(const Expr *e, void *ud) {
    Splits *sp = ud;
    int64_t coef[MAXL], off;
    int v = sp->var;
    if (!ix_affine(e->index, sp->nvars, coef, &off) || coef[v] == 0) return;
    for (int d = 0; d < sp->nvars; d++)
        if (coef[d] && d != v) return;
    if (e->lo != EX_NOLO) split_add(sp, crossing(coef[v], off, e->lo));
    if (e->hi != EX_NOHI) split_add(sp, crossing(coef[v], off, e->hi));
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The points at which to split the first loop (sorted, inside it), or 0
 * when it stays one loop. */
static int outer_splits(KGen *K, int64_t *at) {
    if (K->npl < 1 || cg_is_parallel(K) || K->epi.on || K->st.on || K->ndims < 1) return 0;
    const Loop *l = &K->loop[K->pnest[0]];
    if (l->lo || l->hi || l->step != 1 || K->loop_of[0] != K->pnest[0]) return 0;
    if (K->ndims > 1 && K->loop_of[1] == K->pnest[0]) return 0; /* dims merged */
    Splits sp = {.extent = l->extent, .var = 0};
    for (int i = 0; i < K->k->n; i++) {
        const Buffer *b = member_buf(K, i);
        sp.nvars = cg_member_vars(snode(K->g, K->k->members[i]));
        if (b->expr) ex_selects(b->expr, split_select, &sp);
    }
    if (sp.over || sp.n < 2) return 0; /* a single point: a pad's edge, left as it is */
    qsort(sp.at, (size_t)sp.n, sizeof *sp.at, cmp_i64);
    memcpy(at, sp.at, sizeof(int64_t) * (size_t)sp.n);
    return sp.n;
}

/* At most this many points split the innermost loop (each range is a copy
 * of its body). */
#define INNER_SPLIT_MAX 8

/* The points at which to split the row nest's innermost loop, a pointwise
 * kernel's last dim alone (sorted, inside it), or 0: as outer_splits, for
 * the border tests of a pad or a concat along the last dim (a pool's
 * padded input: each row's first and last elements read nothing, the ones
 * between always read; with the loop split there GCC drops the masked
 * loads of the middle range: resnet18's 64 x 114 x 114 pad ran in a third
 * of the time on a Zen 3, docs/decisions.md: Pools: a materialized pad for
 * 3-D and strided padded windows). */
static int inner_splits(KGen *K, int64_t *at) {
    int d = K->ndims - 1;
    if (K->k->kind != KK_POINTWISE || K->npl < 1 || K->epi.on || K->st.on || K->st.prefetch ||
        K->rp.n > 1 || d < 0)
        return 0;
    if (K->npl < 2 && cg_is_parallel(K)) return 0; /* the worksharing loop itself */
    int L = K->pnest[K->npl - 1];
    const Loop *l = &K->loop[L];
    if (l->lo || l->hi || l->step != 1 || K->loop_of[d] != L || K->div[d] != 1) return 0;
    if (d > 0 && K->loop_of[d - 1] == L) return 0; /* dims merged */
    Splits sp = {.extent = l->extent, .var = d};
    for (int i = 0; i < K->k->n; i++) {
        const Buffer *b = member_buf(K, i);
        sp.nvars = cg_member_vars(snode(K->g, K->k->members[i]));
        if (sp.nvars != K->ndims) return 0;
        if (b->expr) ex_selects(b->expr, split_select, &sp);
    }
    if (sp.over || sp.n < 1 || sp.n > INNER_SPLIT_MAX) return 0;
    qsort(sp.at, (size_t)sp.n, sizeof *sp.at, cmp_i64);
    memcpy(at, sp.at, sizeof(int64_t) * (size_t)sp.n);
    return sp.n;
}

/* Is splitting the loop at these points worth its copies? Where every part
 * is shorter than a vector (CG_SHORT_PART), each runs scalar, and that pays
 * only when the parts drop costly work the whole loop computes on every
 * element and selects away: a detection head's rows of 6 (4 coordinates,
 * then sigmoids) split at 4 and 5 took 0.08 ms, unsplit 0.21. Without a
 * vecmath call in the nest (body_text), a row of 13 with a 9-wide max
 * window split into nine scalar parts took 0.49-0.61 ms against 0.10-0.13
 * for the one masked vector loop (docs/decisions.md: Pools: a
 * materialized pad for 3-D and strided padded windows). */
static bool inner_split_pays(const Loop *l, const int64_t *at, int n, const char *body_text) {
    int64_t longest = 0;
    for (int i = 0; i <= n; i++) {
        int64_t lo = i ? at[i - 1] : 0, hi = i < n ? at[i] : l->extent;
        if (hi - lo > longest) longest = hi - lo;
    }
    return longest >= CG_SHORT_PART || strstr(body_text, "_v(") != NULL;
}

/* text with the loop headed `for (int64_t v = 0; v < extent; v++) {` (and
 * the `#pragma` line just above it, if any) written once per range
 * between the points at, each copy with its range's bounds; NULL when the
 * loop is not found as one. */
static const char *split_inner_text(KGen *K, const char *text, const Loop *l, const int64_t *at,
                                    int n) {
    const char *head = pool_printf(K->g->pool, "for (int64_t %s = 0; %s < %lld; %s++) {", l->name,
                                   l->name, (long long)l->extent, l->name);
    const char *h = strstr(text, head);
    if (!h || strstr(h + 1, head)) return NULL;
    const char *start = h; /* the header's line, or the pragma line above it */
    while (start > text && start[-1] != '\n') start--;
    const char *prev = start;
    if (prev > text) {
        prev--;
        while (prev > text && prev[-1] != '\n') prev--;
        const char *q = prev + strspn(prev, " ");
        if (!strncmp(q, "#pragma", 7)) start = prev;
    }
    const char *body = h + strlen(head), *end = body;
    for (int depth = 1; *end && depth > 0; end++) depth += *end == '{' ? 1 : *end == '}' ? -1 : 0;
    if (end[-1] != '}') return NULL;
    while (*end && *end != '\n') end++; /* the rest of the closing line */
    if (*end) end++;
    Str o;
    str_init(&o, K->g->pool);
    str_putf(&o, "%.*s", (int)(start - text), text);
    const char *line = h; /* the header's line: its indentation */
    while (line > text && line[-1] != '\n') line--;
    int ind = (int)(h - line);
    str_putf(&o,
             "%*s/* %s split at %d point%s: the inner loop's guards are constant in each "
             "part */\n",
             ind, "", l->name, n, n > 1 ? "s" : "");
    const char *mark = strstr(body, CG_INNER_MARK);
    if (!mark || mark > end) return NULL;
    size_t ml = strlen(CG_INNER_MARK);
    for (int i = 0; i <= n; i++) {
        int64_t lo = i ? at[i - 1] : 0, hi = i < n ? at[i] : l->extent;
        str_putf(&o, "%.*sfor (int64_t %s = %lld; %s < %lld; %s++) {%.*s%s%.*s", (int)(h - start),
                 start, l->name, (long long)lo, l->name, (long long)hi, l->name, (int)(mark - body),
                 body, hi - lo < CG_SHORT_PART ? CG_SHORT_MARK : CG_INNER_MARK,
                 (int)(end - mark - ml), mark + ml);
    }
    str_putf(&o, "%s", end);
    return str_get(&o);
}

/* The row nest's text (as cg_nest_text writes it), its first loop split
 * at the points of outer_splits, else its innermost loop at those of
 * inner_splits. */
static void row_nest_text(KGen *K, Str *o) {
    int64_t at[SPLIT_MAX];
    int n = outer_splits(K, at);
    Str one;
    str_init(&one, K->g->pool);
    if (!n) {
        int ni = inner_splits(K, at);
        cg_nest_text(K, ni ? &one : o, true, K->pnest, 0, K->npl, 0, 4, NULL);
        if (!ni) return;
        const Loop *l = &K->loop[K->pnest[K->npl - 1]];
        const char *split = inner_split_pays(l, at, ni, str_get(&one))
                                ? split_inner_text(K, str_get(&one), l, at, ni)
                                : NULL;
        str_putf(o, "%s", split ? split : str_get(&one));
        return;
    }
    cg_nest_text(K, &one, true, K->pnest, 0, K->npl, 0, 4, NULL);
    const Loop *l = &K->loop[K->pnest[0]];
    const char *text = str_get(&one);
    const char *head = pool_printf(K->g->pool, "for (int64_t %s = 0; %s < %lld; %s++) {", l->name,
                                   l->name, (long long)l->extent, l->name);
    const char *at_head = strstr(text, head);
    if (!at_head) cg_fail(K->g, "codegen: %s: no loop header to split", K->k->kernel);
    size_t pre = (size_t)(at_head - text), hl = strlen(head);
    str_putf(o, "%*s/* %s in %d ranges: the guards of its loads are constant in each */\n", 4, "",
             l->name, n + 1);
    for (int i = 0; i <= n; i++) {
        int64_t lo = i ? at[i - 1] : 0, hi = i < n ? at[i] : l->extent;
        str_putf(o, "%.*sfor (int64_t %s = %lld; %s < %lld; %s++) {%s", (int)pre, text, l->name,
                 (long long)lo, l->name, (long long)hi, l->name, at_head + hl);
    }
}

static void function_text(KGen *K, Str *o) {
    Str body;
    str_init(&body, K->g->pool);
    cg_put_indented(&body, str_get(&K->block[0]), 4);
    bool returns_int = needs_malloc(K);
    if (cg_has_scratch_region(K)) {
        region_text(K, &body);
    } else {
        cg_scratch_decls(K, &body, 4, false);
        row_nest_text(K, &body);
        if (K->st.used) str_putf(&body, "    kiln_stream_fence();\n");
        scratch_frees(K, &body, 4);
        if (returns_int) str_putf(&body, "    return 0;\n");
    }
    kernel_comment(K, o);
    signature(K, o, returns_int);
    str_putf(o, "{\n%s}\n\n", str_get(&body));
}

CgCall cg_make_call(Gen *g, int kidx, const uint8_t *use, bool parallel, int inner) {
    CgCall c = {.name = g->s->kernels[kidx].kernel,
                .kernel = kidx,
                .parallel = parallel,
                .inner_loops = inner};
    c.bufs = pool_alloc(g->pool, sizeof(int) * (size_t)(g->p->nbufs + 1));
    c.writes = pool_alloc(g->pool, sizeof(bool) * (size_t)(g->p->nbufs + 1));
    for (int b = 0; b < g->p->nbufs; b++)
        if (use[b]) {
            c.bufs[c.nbufs] = b;
            c.writes[c.nbufs++] = (use[b] & USE_WRITE) != 0;
        }
    return c;
}

/* Generate kernel kidx; true when its function returns a status (it
 * mallocs row scratch). */
static bool gen_kernel(Gen *g, int kidx) {
    KGen *K = pool_alloc(g->pool, sizeof *K);
    K->g = g;
    K->k = &g->s->kernels[kidx];
    cg_setup_kernel(K);
    cg_gen_stages(K);
    function_text(K, &g->out);
    g->calls[kidx] = cg_make_call(g, kidx, K->use, cg_is_parallel(K), K->inner_loops);
    return needs_malloc(K);
}

static void generate(Gen *g) {
    name_buffers(g);
    g->calls = pool_alloc(g->pool, sizeof(CgCall) * (size_t)(g->s->nkernels + 1));
    bool *returns_int = pool_alloc(g->pool, sizeof(bool) * (size_t)(g->s->nkernels + 1));
    str_putf(&g->out, "/* ===== kernels%s%s ===== */\n\n", *g->prefix ? ": " : "", g->prefix);
    g->epi = pool_alloc(g->pool, sizeof(Epi) * (size_t)(g->s->nkernels + 1));
    for (int k = 0; k < g->s->nkernels; k++) {
        if (g->s->kernels[k].kind == KK_EXTERN) {
            if (g->s->kernels[k].n > 1) cg_gen_epilogue(g, k);
            continue;
        }
        returns_int[k] = gen_kernel(g, k);
    }
    cg_entry_text(g, returns_int);
    if (!g->no_prelude) cg_prepend_prelude(g);
}

kiln_status cg_generate_opts(const Schedule *s, const CgOptions *opt, CgOutput *out, char *err,
                             size_t errlen) {
    static const CgOptions none = {NULL, false, false};
    const CgOptions *o = opt ? opt : &none;
    memset(out, 0, sizeof *out);
    if (errlen) err[0] = 0;
    Gen *g = kcalloc(1, sizeof *g);
    if (!g) {
        util_fmt(err, errlen, "out of memory");
        return KILN_ERR_NOMEM;
    }
    g->pool = &out->pool;
    g->s = s;
    g->p = s->prog;
    g->err = err;
    g->errlen = errlen;
    g->prefix = o->prefix ? o->prefix : "";
    g->no_prelude = o->no_prelude;
    g->double_acc = o->double_acc;
    g->status = KILN_ERR_INPUT;
    str_init(&g->out, g->pool);
    str_init(&g->protos, g->pool);
    out->pool.oom = &g->jb;
    int r = setjmp(g->jb);
    if (r) {
        kiln_status st = r == 1 ? KILN_ERR_NOMEM : g->status;
        if (r == 1) util_fmt(err, errlen, "out of memory");
        kfree(g->owned_vm);
        kfree(g);
        cg_free(out);
        return st;
    }
    generate(g);
    out->source = str_get(&g->out);
    out->len = g->out.n;
    out->entry = pool_printf(g->pool, "%skiln_entry", g->prefix);
    out->ncalls = s->nkernels;
    out->calls = g->calls;
    out->pool.oom = NULL;
    kfree(g);
    return KILN_OK;
}

kiln_status cg_generate(const Schedule *s, CgOutput *out, char *err, size_t errlen) {
    return cg_generate_opts(s, NULL, out, err, errlen);
}

void cg_free(CgOutput *out) {
    if (!out) return;
    pool_free(&out->pool);
    memset(out, 0, sizeof *out);
}
