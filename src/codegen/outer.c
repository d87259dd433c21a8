/*
 * outer.c -- outer reduction. When a reduction's reduced dims are strided
 * in memory and its innermost parallel dim is contiguous (sum(x, dim=0)),
 * the natural order would walk the innermost loop with a stride. Instead
 * that dim's loop (K->outer.xin) moves below the reduced loops and runs over
 * blocks of CG_OUTER_BLOCK elements: the row nest ends in the loop over
 * blocks, and the accumulators are arrays of a block, one per element, so
 * the innermost loop is contiguous and vectorizes.
 */
#include "codegen/codegen.h"
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* acc[x - block] = acc[x - block] op v, for an outer reduction. */
static const char *outer_acc(KGen *K, const char *acc) {
    const Loop *x = &K->loop[K->outer.xin], *blk = &K->loop[K->pnest[K->npl - 1]];
    return pool_printf(K->g->pool, "%s[%s - %s]", acc, x->name, blk->name);
}

/* Outer reduction: one accumulator per element of the block, so the lanes
 * never combine and max/min need no NaN flag (kiln_max keeps a NaN). */
void cg_gen_outer_reduction_member(KGen *K, int i) {
    const SNode *n = snode(K->g, K->k->members[i]);
    const Buffer *b = member_buf(K, i);
    Pool *P = K->g->pool;
    bool minmax = b->rop == ROP_AMAX || b->rop == ROP_AMIN, wide = K->g->double_acc && !minmax;
    const char *acc = pool_printf(P, "acc_%s", K->g->bufname[b->id]), *el = outer_acc(K, acc);
    int64_t block = K->loop[K->pnest[K->npl - 1]].step;
    cg_line(K, K->npl, "%s %s[%lld];", wide ? "double" : "float", acc, (long long)block);
    cg_line(K, K->npl, "for (int64_t i = 0; i < %lld; i++) %s[i] = %s;", (long long)block, acc,
            cg_rop_identity(b->rop));
    Val v = cg_emit_expr(K, b->expr, n->np + n->nr);
    switch (b->rop) {
    case ROP_SUM: cg_line(K, K->inner, "%s += %s%s;", el, wide ? "(double)" : "", v.c); break;
    case ROP_PROD: cg_line(K, K->inner, "%s *= %s%s;", el, wide ? "(double)" : "", v.c); break;
    case ROP_AMAX: cg_line(K, K->inner, "%s = kiln_max(%s, %s);", el, el, v.c); break;
    case ROP_AMIN: cg_line(K, K->inner, "%s = kiln_min(%s, %s);", el, el, v.c); break;
    }
    K->outer.members[K->outer.n++] = i;
    K->has_red = true;
}

/* In the loop over the block after the reduced loops: store the result and
 * hand it to the row steps. */
static void finish_outer_reduction(KGen *K, int i) {
    const SNode *n = snode(K->g, K->k->members[i]);
    const Buffer *b = member_buf(K, i);
    Pool *P = K->g->pool;
    bool wide = K->g->double_acc && b->rop != ROP_AMAX && b->rop != ROP_AMIN;
    const char *el = outer_acc(K, pool_printf(P, "acc_%s", K->g->bufname[b->id]));
    if (wide) el = pool_printf(P, "(float)%s", el);
    IxText ix = cg_print_index(K, cg_store_index(K, n->np, n->P), n->np);
    if (K->k->store[i] == STORE_GLOBAL) {
        cg_note_access(K, b->id, ix, USE_WRITE);
        cg_line(K, K->inner, "%s[%s] = %s;", K->g->bufname[b->id], ix.c, el);
    }
    cg_table_add(P, &K->regs, cg_reg_key(P, b->id, ix.c), el, K->inner, K->epoch[K->inner]);
}

void cg_walk_load(const Expr *e, void *ud) {
    Walk *w = ud;
    int64_t coef[MAXL], off, lc[MAXL];
    if (!ix_affine(e->index, w->nvars, coef, &off) || !cg_loop_coefs(w->K, coef, w->nvars, lc)) {
        w->r_strided = true; /* div/mod: treat as scattered */
        return;
    }
    if (lc[w->lr] == 1 || lc[w->lr] == -1)
        w->r_unit = true;
    else if (lc[w->lr])
        w->r_strided = true;
    if (lc[w->lp] == 1) w->p_unit = true;
}

/* Worth it (and possible): one inner stage followed by row steps, nothing
 * kept per row across inner loops, every load that moves with the reduced
 * loop strided, some load contiguous along the parallel loop, and that
 * loop long enough to fill vectors. */
bool cg_want_outer(KGen *K) {
    const Kernel *k = K->k;
    if (k->kind != KK_REDUCTION || !K->npl || !K->nrl || k->nstages < 1) return false;
    if (k->stage_kind[0] != STAGE_INNER) return false;
    for (int s = 1; s < k->nstages; s++)
        if (k->stage_kind[s] != STAGE_ROW) return false;
    Walk w = {K, 0, K->rl[K->nrl - 1], K->pnest[K->npl - 1], false, false, false};
    if (K->loop[w.lp].extent < 16) return false;
    for (int i = 0; i < k->n; i++) {
        const Buffer *b = member_buf(K, i);
        if (k->stage[i] != 0) continue;
        if (b->body != BODY_REDUCTION && k->store[i] == STORE_ROW_LOCAL) return false;
        w.nvars = cg_member_vars(snode(K->g, k->members[i]));
        if (b->expr) ex_loads(b->expr, cg_walk_load, &w);
    }
    return w.r_strided && !w.r_unit && w.p_unit;
}

/* The innermost parallel loop becomes xin, running one block; a loop over
 * blocks takes its place at the end of the row nest. */
void cg_make_outer(KGen *K) {
    int xin = K->pnest[K->npl - 1];
    K->pnest[K->npl - 1] = cg_split_loop(K, xin, CG_OUTER_BLOCK);
    K->outer.xin = xin;
}

/* Outer reduction: the inner stage, then one loop over the block holding
 * the reductions' stores and every row step. */
void cg_gen_outer_stages(KGen *K) {
    const Kernel *k = K->k;
    cg_begin_stage(K, STAGE_INNER);
    for (int i = 0; i < k->n; i++)
        if (k->stage[i] == 0) cg_gen_member(K, i);
    cg_end_stage(K);
    cg_begin_stage(K, STAGE_ROW);
    for (int j = 0; j < K->outer.n; j++) finish_outer_reduction(K, K->outer.members[j]);
    for (int i = 0; i < k->n; i++)
        if (k->stage[i] > 0) cg_gen_member(K, i);
    cg_end_stage(K);
}
