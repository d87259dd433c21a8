/*
 * tiles.c -- tiles for transposes. A pointwise kernel whose loads read one
 * operand transposed walks its last two loops in CG_TILE x CG_TILE tiles,
 * with the tile's inner loop on the dim the loads are contiguous in, so
 * both the stores and the transposed loads stay within the cache lines of
 * one tile.
 */
#include "codegen/codegen.h"
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A pointwise kernel whose innermost loop reads some buffer across rows
 * (a transpose) walks the last two loops in square tiles: the input rows a
 * tile touches stay in L1 while the tile is written row by row. */
bool cg_want_tiles(KGen *K) {
    if (K->k->kind != KK_POINTWISE || K->npl < 2) return false;
    Walk w = {K, K->ndims, K->pnest[K->npl - 1], K->pnest[K->npl - 2], false, false, false};
    if (K->loop[w.lr].extent < 16 || K->loop[w.lp].extent < 16) return false;
    for (int i = 0; i < K->k->n; i++) {
        const Buffer *b = member_buf(K, i);
        if (b->expr) ex_loads(b->expr, cg_walk_load, &w);
    }
    return w.r_strided && w.p_unit;
}

/* The tiles of the column blocks (b) outside those of the row blocks (a):
 * consecutive tiles then go on along the loads' contiguous dim (a), so
 * each of the 32 rows a tile reads continues where the previous tile's
 * stopped, and the hardware prefetcher follows them; the other way round
 * every tile started 32 new rows (docs/decisions.md: Transpose tiles walk
 * the loads' contiguous dim). */
void cg_make_tiles(KGen *K) {
    int a = K->pnest[K->npl - 2], b = K->pnest[K->npl - 1];
    K->pnest[K->npl - 2] = cg_split_loop(K, b, CG_TILE);
    K->pnest[K->npl - 1] = cg_split_loop(K, a, CG_TILE);
    K->pnest[K->npl++] = a;
    K->pnest[K->npl++] = b;
}
