/*
 * pairs.c -- row pairs. A row reduction kernel whose rows are long
 * (CG_PAIR_MIN) runs the innermost row loop two rows at a time, each
 * stage's loop doing the work of both rows side by side: row x0 and row
 * (x0 + 1), the second with its own accumulators (suffix _1). Each row
 * still sums in the same order, so the results are bit-identical to one
 * row at a time; but two independent accumulator chains and two memory
 * streams keep more loads in flight, where one row at a time is limited by
 * the latency of a max chain (docs/decisions.md: Row pairs). That held on
 * an Intel Xeon; on an AMD EPYC (Zen 4) one stream per core reads faster,
 * so pairs follow KilnConfig.row_pairs (on for Intel CPUs, $KILN_ROW_PAIRS).
 */
#include "codegen/codegen.h"
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Row pairs (above): a row reduction that reads its long rows once (one
 * inner stage; row steps are fine), whose innermost row loop is a plain
 * loop over an even count, with enough pairs to share out (a [4, 100000]
 * sum keeps four rows for four threads). Not for several inner stages: the
 * later ones read the row again from L1, and two rows (plus a layer norm's
 * weight and bias) no longer fit there (docs/decisions.md: Row pairs). */
bool cg_want_pairs(KGen *K) {
    const Kernel *k = K->k;
    if (!K->g->s->cfg.row_pairs || K->epi.on || k->kind != KK_REDUCTION || K->outer.xin >= 0 ||
        K->npl == 0)
        return false;
    int inner = 0;
    for (int st = 0; st < k->nstages; st++) inner += k->stage_kind[st] == STAGE_INNER;
    if (inner != 1) return false;
    int64_t rows = 1;
    for (int j = 0; j < K->npl; j++) rows *= K->loop[K->pnest[j]].extent;
    const Loop *L = &K->loop[K->pnest[K->npl - 1]];
    return !L->lo && L->step == 1 && L->extent % 2 == 0 && k->rnumel >= CG_PAIR_MIN &&
           rows / 2 >= CG_PARALLEL_ITERS;
}

void cg_make_pairs(KGen *K) {
    Loop *L = &K->loop[K->pnest[K->npl - 1]];
    L->step = 2;
    K->rp.n = 2;
    K->rp.row_name = L->name;
}

/* Emit the members that follow for row p of the pair: the second row is
 * the row loop's variable plus one, with its own accumulator names. */
void cg_pair_row(KGen *K, int p) {
    if (K->rp.n == 1) return;
    K->loop[K->pnest[K->npl - 1]].name =
        p ? pool_printf(K->g->pool, "(%s + 1)", K->rp.row_name) : K->rp.row_name;
    K->rp.sfx = p ? "_1" : "";
}
