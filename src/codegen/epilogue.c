/*
 * epilogue.c -- extern epilogues. An extern kernel with fused pointwise
 * members (the scheduler's extern epilogue) becomes a library call plus a
 * static function `epi_<k>(out, start, count, buffers...)` that applies the
 * members to the flat output elements [start, start + count), and a
 * callback `epi_<k>_cb(ctx, c, start, count)` that the library
 * (src/externs/) calls on each output block right after computing it. The
 * members are generated as a pointwise kernel of their own, reading the
 * library's output as `out`, over at most two loops: the innermost group of
 * dims that merge (the vectorized loop) and one loop over all the others,
 * each clipped to the range; broadcast operands (a bias per column, BN
 * parameters per channel) index with division and modulo of the outer
 * loop, once per row. The library writes the extern's buffer when something
 * else reads it, else the last member's buffer, which the epilogue
 * overwrites in place.
 */
#include "codegen/codegen.h"
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* An epilogue runs on any flat range [start, start + count) of its output:
 * its dims become at most two loops, the innermost group of dims that merge
 * (the contiguous, vectorized loop) and one loop over all the others (a
 * "row", split into dims by division), so a range is rows clipped at both
 * ends. */
void cg_epilogue_merges(int ndims, bool *ok) {
    int s = ndims - 1;
    while (s > 0 && ok[s - 1]) s--;
    for (int d = 0; d + 1 < s; d++) ok[d] = true;
}

/* The epilogue's loops cover [start, start + count): one loop over the
 * range, or rows from the one holding start to the one holding the last
 * element, each clipped to the range. */
void cg_epilogue_bounds(KGen *K) {
    Pool *P = K->g->pool;
    if (K->npl == 0) return; /* a scalar output: the body runs once, guarded */
    Loop *in = &K->loop[K->pnest[K->npl - 1]];
    if (K->npl == 1) {
        in->lo = "start";
        in->hi = "start + count";
        return;
    }
    Loop *row = &K->loop[K->pnest[0]];
    long long I = (long long)in->extent;
    const char *r = row->name;
    row->lo = pool_printf(P, "start / %lld", I);
    row->hi = pool_printf(P, "(start + count + %lld) / %lld", I - 1, I);
    in->lo = pool_printf(P, "(start > %s * %lld ? start - %s * %lld : 0)", r, I, r, I);
    in->hi = pool_printf(P, "(start + count < (%s + 1) * %lld ? start + count - %s * %lld : %lld)",
                         r, I, r, I, I);
}

/* The members after the extern, as a pointwise kernel of their own: they
 * iterate the extern's output space (the scheduler's rule), and read the
 * library's output as `out` with its write index. */
static Kernel *epilogue_kernel(Gen *g, int kidx) {
    const Kernel *k = &g->s->kernels[kidx];
    Kernel *e = pool_alloc(g->pool, sizeof *e);
    *e = *k;
    e->kind = KK_POINTWISE;
    e->kernel = pool_printf(g->pool, "epi_%d", kidx);
    e->n = k->n - 1;
    e->members = k->members + 1;
    e->stage = k->stage + 1;
    e->store = k->store + 1;
    e->nr = 0;
    e->rnumel = 1;
    e->nstages = 1;
    return e;
}

static void epilogue_comment(KGen *K, Str *o, const Kernel *ext, const Epi *e) {
    Gen *g = K->g;
    const Kernel *k = K->k;
    str_putf(o, "/*\n * %s%s: epilogue of %s (%s) over [", g->prefix, k->kernel, ext->kernel,
             snode(g, ext->members[0])->name);
    for (int d = 0; d < k->np; d++) str_putf(o, "%s%lld", d ? ", " : "", (long long)k->P[d]);
    str_putf(o, "], run by the library on each output\n * block it has just computed, "
                "elements [start, start + count) of out\n * origins:");
    for (int i = 0; i < ext->norigins; i++) str_putf(o, " %s", ext->origins[i]);
    str_putf(o, "\n *   out: %s, written by %s\n", g->bufname[e->target], ext->kernel);
    for (int i = 0; i < k->n; i++) {
        int b = snode(g, k->members[i])->buf;
        str_putf(o, " *   %s -> %s: pointwise, %s%s\n", snode(g, k->members[i])->name,
                 g->bufname[b], store_name[k->store[i]], b == e->target ? " in place (out)" : "");
    }
    str_putf(o, " */\n");
}

/* The function and its callback for the library: `epi(out, start, count,
 * buffers...)` and `epi_cb(ctx, c, start, count)`, ctx being kiln_entry's
 * bufs. */
static void epilogue_text(KGen *K, Str *o, const Kernel *ext, const Epi *e) {
    Gen *g = K->g;
    Str body, args;
    str_init(&body, g->pool);
    str_init(&args, g->pool);
    epilogue_comment(K, o, ext, e);
    Str sig;
    str_init(&sig, g->pool);
    /* static wherever the program compiles: only its _cb is called from
     * elsewhere (kiln_entry), and a global one was compiled twice, on its
     * own and inlined into the _cb (jit.c: two translation units) */
    str_putf(&sig, "static void %s%s(float *restrict out, int64_t start, int64_t count", g->prefix,
             K->k->kernel);
    for (int b = 0; b < g->p->nbufs; b++) {
        if (!e->use[b]) continue;
        str_putf(&sig, ", %sfloat *restrict %s", e->use[b] & USE_WRITE ? "" : "const ",
                 g->bufname[b]);
        str_putf(&args, ", bufs[%d]", b);
    }
    str_putf(o, "%s)\n{\n", str_get(&sig));
    str_putf(&g->protos,
             "KILN_FN void %s%s_cb(void *ctx, float *c, int64_t start, int64_t count);\n",
             g->prefix, K->k->kernel);
    if (K->npl == 0)
        str_putf(&body, "    if (start > 0 || count < 1) return;   /* one element */\n");
    cg_put_indented(&body, str_get(&K->block[0]), 4);
    cg_nest_text(K, &body, true, K->pnest, 0, K->npl, 0, 4, NULL);
    str_putf(o, "%s}\n\n", str_get(&body));
    str_putf(o,
             "KILN_FN void %s%s_cb(void *ctx, float *c, int64_t start, int64_t count)\n{\n"
             "    float *const *bufs = ctx;\n    (void)bufs;\n"
             "    %s%s(c, start, count%s);\n}\n\n",
             g->prefix, K->k->kernel, g->prefix, K->k->kernel, str_get(&args));
}

/* An extern kernel's epilogue members become a function the library calls
 * on each output block. The library writes the extern's own buffer when
 * something else reads it, else the buffer of the last member (always
 * stored: nothing in the kernel reads it), which the epilogue then
 * overwrites in place, element by element: each element is read before it
 * is written, at the same index. */
void cg_gen_epilogue(Gen *g, int kidx) {
    const Kernel *k = &g->s->kernels[kidx];
    Epi *e = &g->epi[kidx];
    int ext = snode(g, k->members[0])->buf, last = snode(g, k->members[k->n - 1])->buf;
    if (k->store[k->n - 1] != STORE_GLOBAL)
        cg_fail(g, "codegen: %s: last member not stored", k->kernel);
    e->target = k->store[0] == STORE_GLOBAL ? ext : last;
    const char *names[2] = {g->bufname[ext], g->bufname[e->target]};
    g->bufname[ext] = g->bufname[e->target] = "out";
    KGen *K = pool_alloc(g->pool, sizeof *K);
    K->g = g;
    K->k = epilogue_kernel(g, kidx);
    K->epi.on = true;
    cg_setup_kernel(K);
    cg_gen_stages(K);
    g->bufname[ext] = names[0];
    g->bufname[e->target] = names[1];
    e->use = K->use;
    e->use[ext] = e->use[e->target] = 0;
    e->fn = pool_printf(g->pool, "%s%s", g->prefix, K->k->kernel);
    epilogue_text(K, &g->out, k, e);
    g->calls[kidx].inner_loops = K->inner_loops;
}
