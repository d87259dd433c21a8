/*
 * stream.c -- streamed stores. A buffer of at least CG_STREAM_MIN bytes is
 * not stored element by element: the innermost loop writes its values into
 * a per-thread tile (st_<buf>, in L1) and after the loop kiln_stream copies
 * the tile out with non-temporal stores, which do not read the lines they
 * write first (an ordinary store reads them: a third of a copy's traffic).
 * In a row kernel the tile is the row (an inner stage's loop, up to
 * CG_STREAM_ROW), and a later stage that reads the buffer again reads the
 * tile; a pointwise kernel's innermost loop is split into blocks of
 * CG_STREAM_TILE when it is longer (plan_stream), of CG_STREAM_TILE_MATH
 * with expensive math, asking for its large inputs CG_STREAM_PF_AHEAD
 * elements ahead. The fence that orders the streamed stores runs once per
 * thread, after the row loop: a fence after each row's copy waits for that
 * row to reach memory. A row stage whose loop runs over a multiple of 16
 * and has no reduction of its own streams vector by vector instead
 * (nest_text): each group of 16 goes out with kiln_stream16 right after
 * it, from the register, so the copy after the loop is gone
 * (docs/decisions.md: Streamed stores).
 */
#include "codegen/codegen.h"
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static bool stream_buffer(const Buffer *b);

/* A streaming math kernel's load along its tiles, from a buffer too large
 * for the caches (stream_buffer): at the start of each tile, ask for the
 * tile's worth of it CG_STREAM_PF_AHEAD elements ahead (kiln_prefetch_ahead
 * stays inside the buffer). */
void cg_note_stream_load(KGen *K, int buf, IxText ix) {
    const Buffer *b = buf_of(K->g, buf);
    if (ix.level != K->inner || !ix.unit || !stream_buffer(b)) return;
    Pool *P = K->g->pool;
    const char *tile = K->loop[K->pnest[K->npl - 2]].name,
               *var = K->loop[K->pnest[K->npl - 1]].name;
    const char *ahead = pool_printf(P, "%s + %d", tile, CG_STREAM_PF_AHEAD);
    const char *at = pool_printf(P, "kiln_prefetch_ahead(%s, %s, %lld, %lld);", K->g->bufname[buf],
                                 cg_subst_ident(P, ix.c, var, ahead), (long long)K->st.tile,
                                 (long long)b->numel);
    cg_pf_add(K, at);
}

static bool stream_buffer(const Buffer *b) {
    return b->numel * loop_elsize(b->dtype) >= CG_STREAM_MIN;
}

/* text with each identifier `name` in it replaced by `(repl)`. */
const char *cg_subst_ident(Pool *p, const char *text, const char *name, const char *repl) {
    Str o;
    str_init(&o, p);
    size_t n = strlen(name);
    for (const char *c = text; *c;) {
        bool start = c == text || !(isalnum((unsigned char)c[-1]) || c[-1] == '_');
        if (start && !strncmp(c, name, n) && !(isalnum((unsigned char)c[n]) || c[n] == '_')) {
            str_putf(&o, "(%s)", repl);
            c += n;
        } else {
            str_putf(&o, "%c", *c++);
        }
    }
    return str_get(&o);
}

/* A pointwise kernel that stores a large buffer: its innermost loop covers
 * at most CG_STREAM_ROW elements (a longer one is split into blocks of
 * CG_STREAM_TILE), so each large store can go through a tile. Not for
 * transposing tiles, whose rows are short. A kernel with expensive math
 * (exp, sin, erf, ...; random numbers) streams tiles of CG_STREAM_TILE_MATH
 * whatever its rows: its math runs between the bursts of streamed stores,
 * and a burst of a long tile stalls it. Such a kernel also asks for its
 * large inputs CG_STREAM_PF_AHEAD elements ahead at the start of each tile
 * (note_stream_load): the hardware prefetcher alone falls behind while the
 * core computes (docs/decisions.md: Streamed tiles for kernels with
 * expensive math). */
void cg_plan_stream(KGen *K) {
    if (K->epi.on || K->k->kind != KK_POINTWISE || K->npl == 0) return;
    bool any = false, math = false;
    for (int i = 0; i < K->k->n; i++) {
        const Buffer *b = member_buf(K, i);
        math |= b->body == BODY_RAND || (b->body == BODY_POINTWISE && ex_expensive(b->expr) >= 0);
        any |= K->k->store[i] == STORE_GLOBAL && stream_buffer(b);
    }
    int L = K->pnest[K->npl - 1];
    if (!any || K->loop[L].lo || K->loop[L].step != 1) return;
    K->st.tile = math ? CG_STREAM_TILE_MATH : CG_STREAM_TILE;
    if (K->loop[L].extent > (math ? CG_STREAM_TILE_MATH : CG_STREAM_ROW)) {
        K->pnest[K->npl - 1] = cg_split_loop(K, L, K->st.tile);
        K->pnest[K->npl++] = L;
        K->st.prefetch = math;
    }
    K->st.on = true;
}

/* The store of v to buffer b at ix through a tile, when it is a large
 * buffer stored along the innermost loop of a row stage or of a streaming
 * pointwise kernel: the tile element is written now, and the copy of the
 * tile to memory goes after the loop (K->post). false: store as usual. */
bool cg_stream_store(KGen *K, const Buffer *b, IxText ix, Val v) {
    if (K->f64 || !stream_buffer(b) || !ix.unit || ix.level != K->inner || K->guard ||
        K->innermost < 0)
        return false;
    const Loop *l = &K->loop[K->innermost];
    if (K->k->kind == KK_POINTWISE ? !K->st.on
                                   : K->epi.on || K->outer.xin >= 0 || K->rp.n != 1 ||
                                         K->nsn != 1 || l->lo || l->extent > CG_STREAM_ROW)
        return false;
    if (l->step != 1) return false;
    Pool *P = K->g->pool;
    int64_t n = l->lo ? K->st.tile : l->extent;
    const char *lo = l->lo ? l->lo : "0";
    const char *count =
        l->lo ? pool_printf(P, "%s - %s", l->hi, l->lo) : pool_printf(P, "%lld", (long long)n);
    const char *tile = pool_printf(P, "st_%s", K->g->bufname[b->id]);
    cg_add_scratch(K, tile, n);
    const char *at = l->lo ? pool_printf(P, "%s - %s", l->name, lo) : l->name;
    const char *slot = pool_printf(P, "%s[%s]", tile, at);
    cg_line(K, K->inner, "%s = %s;", slot, v.c);
    K->st.used = true;
    const char *out = K->g->bufname[b->id];
    if (K->k->kind == KK_REDUCTION) {
        /* a row stage: per vector where the loop allows (see nest_text) */
        str_putf(&K->st.post, "kiln_stream(&%s[%s], %s, %s);\n", out,
                 cg_subst_ident(P, ix.c, l->name, lo), tile, count);
        if (n % CG_LANES == 0 && (K->st.vloop < 0 || K->st.vloop == K->innermost)) {
            const char *g = pool_printf(P, "%sv", l->name);
            K->st.vloop = K->innermost;
            str_putf(&K->st.vpost, "kiln_stream16(&%s[%s], &%s[%s]);\n", out,
                     cg_subst_ident(P, ix.c, l->name, g), tile, g);
        }
    } else {
        str_putf(&K->post, "kiln_stream(&%s[%s], %s, %s);\n", out,
                 cg_subst_ident(P, ix.c, l->name, lo), tile, count);
    }
    /* a later stage of the row reads the tile (in L1), not the streamed
     * copy, which the non-temporal stores sent to memory */
    if (K->k->kind == KK_REDUCTION)
        cg_table_add(P, &K->rows, cg_reg_key(P, b->id, ix.c), slot, ix.level, 0);
    return true;
}
