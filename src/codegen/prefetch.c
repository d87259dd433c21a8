/*
 * prefetch.c -- row prefetch and lanes. A row kernel with several inner
 * stages reads its row from memory in the first and from L1 in the others;
 * before the second, it asks for the next row's data that the first will
 * read (kiln_prefetch), so memory works while the later passes compute.
 * Asked for all at once, the prefetches wait for free line fill buffers, so
 * a second pass longer than CG_ROW_PF_BLOCK runs in blocks, each asking for
 * its part of the next row while it computes (spread_stage); when its
 * length is a multiple of CG_LANES it reduces into that many lanes
 * (K->lane), combined after the loop (docs/decisions.md: Row prefetch).
 */
#include "codegen/codegen.h"
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Add at to K->pf.addr (row prefetch or stream prefetch text) unless there. */
void cg_pf_add(KGen *K, const char *at) {
    for (int i = 0; i < K->pf.n; i++)
        if (!strcmp(K->pf.addr[i], at)) return;
    K->pf.addr = pool_grow(K->g->pool, K->pf.addr, &K->pf.cap, K->pf.n + 1, sizeof *K->pf.addr);
    K->pf.addr[K->pf.n++] = at;
}

void cg_note_row_load(KGen *K, int buf, IxText ix) {
    if (ix.level != K->inner || !ix.unit || K->innermost < 0) return;
    Pool *P = K->g->pool;
    const char *row = K->loop[K->pnest[K->npl - 1]].name;
    const char *at = pool_printf(P, "&%s[%s]", K->g->bufname[buf], ix.c);
    if (!strcmp(cg_subst_ident(P, at, row, "0"), at)) return; /* the same for every row */
    cg_pf_add(K, at);
}

/* The next row's loads of the first inner stage (if this is not the row
 * loop's last iteration): the whole row before the second stage, or, when
 * that stage runs in blocks (spread_stage), the block's part of it at the
 * start of each block. */
void cg_row_prefetch(KGen *K, int r, int blk) {
    Pool *P = K->g->pool;
    const Loop *row = &K->loop[K->pnest[K->npl - 1]];
    const char *next = pool_printf(P, "%s + 1", row->name);
    const char *at = blk < 0 ? "0" : K->loop[blk].name, *n;
    if (blk < 0)
        n = pool_printf(P, "%lld", (long long)K->k->rnumel);
    else
        n = pool_printf(P, "%s + %d < %lld ? %d : %lld - %s", at, CG_ROW_PF_BLOCK,
                        (long long)K->loop[r].extent, CG_ROW_PF_BLOCK, (long long)K->loop[r].extent,
                        at);
    for (int i = 0; i < K->pf.n; i++) {
        const char *p = cg_subst_ident(P, cg_subst_ident(P, K->pf.addr[i], K->loop[r].name, at),
                                       row->name, next);
        cg_line(K, blk < 0 ? K->npl : K->npl + 1, "if (%s < %lld) kiln_prefetch(%s, %s);", next,
                (long long)row->extent, p, n);
    }
    K->pf.n = 0;
}

/* The second inner stage of a row kernel with row prefetch runs its loop
 * in blocks of CG_ROW_PF_BLOCK, each asking for its part of the next row
 * (above): one reduced loop, longer than a block, and no member of the
 * stage stored to memory (a stored one streams whole rows). Returns the
 * block loop, or -1 (the stage runs as usual). */
int cg_spread_stage(KGen *K, int st) {
    if (K->nrl != 1 || K->nloops >= MAXL + 1) return -1;
    int r = K->rl[0];
    if (K->loop[r].lo || K->loop[r].step != 1 || K->loop[r].extent <= CG_ROW_PF_BLOCK) return -1;
    for (int i = 0; i < K->k->n; i++)
        if (K->k->stage[i] == st && K->k->store[i] == STORE_GLOBAL) return -1;
    int b = cg_split_loop(K, r, CG_ROW_PF_BLOCK);
    bool red = false;
    for (int i = 0; i < K->k->n; i++)
        red |= K->k->stage[i] == st && member_buf(K, i)->body == BODY_REDUCTION;
    if (!red || K->loop[r].extent % CG_LANES || K->nloops >= MAXL || K->npl + 3 > MAXL) {
        int ids[2] = {b, r};
        cg_open_stage(K, ids, 2);
        return b;
    }
    /* Its reductions in CG_LANES lanes, each its own accumulator across the
     * blocks: an `omp simd` reduction per block combined its vector into
     * the row's scalar one lane at a time, 16 dependent adds per block
     * (docs/decisions.md: Row reductions in 16 lanes). Inside a block,
     * groups of CG_LANES: r0 runs
     * r0v .. r0v + 16, a constant count GCC makes one vector of. */
    const char *rn = K->loop[r].name;
    int v = cg_new_loop(K, pool_printf(K->g->pool, "%sv", rn), K->loop[r].extent);
    K->loop[v].lo = K->loop[b].name;
    K->loop[v].hi = K->loop[r].hi;
    K->loop[v].step = CG_LANES;
    K->loop[r].lo = K->loop[v].name;
    K->loop[r].hi = pool_printf(K->g->pool, "%s + %d", K->loop[v].name, CG_LANES);
    int ids[3] = {b, v, r};
    cg_open_stage(K, ids, 3);
    K->lane.index = pool_printf(K->g->pool, "%s - %s", rn, K->loop[v].name);
    return b;
}
