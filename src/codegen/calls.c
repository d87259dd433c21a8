/*
 * calls.c -- the extern calls and the entry point. `int kiln_entry(float
 * *const *bufs, const KilnRT *rt)` calls the kernels and the extern kernels
 * in the schedule's order; an extern's operands go to the library as
 * views (KilnView) when it can take them, else packed into a dense copy
 * first, and a call that finds bad input (a gather index out of range)
 * returns KILN_RT_ERR_INPUT.
 */
#include "codegen/codegen.h"
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static void view_text(Gen *g, Str *o, const char *name, const BufView *v) {
    str_putf(o, "        static const KilnView %s = {%d, {", name, v->rank);
    for (int d = 0; d < v->rank; d++) str_putf(o, "%s%lld", d ? ", " : "", (long long)v->shape[d]);
    str_putf(o, "%s}, {", v->rank ? "" : "0"); /* a scalar: {0}, not {} */
    for (int d = 0; d < v->rank; d++) str_putf(o, "%s%lld", d ? ", " : "", (long long)v->stride[d]);
    str_putf(o, "%s}, %lld};\n", v->rank ? "" : "0", (long long)v->offset);
    (void)g;
}

static bool view_dense(const BufView *v) {
    int64_t s = 1;
    for (int d = v->rank - 1; d >= 0; d--) {
        if (v->shape[d] != 1 && v->stride[d] != s) return false;
        s *= v->shape[d];
    }
    return true;
}

/* Conv operands: dense ones are passed as they are; others are packed
 * into malloc'd copies (all allocated before any is used, so a failure
 * frees what it got). */
typedef struct {
    Str allocs, packs, frees;
    Str any_null;
    int n;
} Packs;

static const char *conv_operand(Gen *g, Str *o, const BufView *v, int k, Packs *pk) {
    if (view_dense(v)) {
        if (!v->offset) return pool_printf(g->pool, "bufs[%d]", v->buf);
        return pool_printf(g->pool, "bufs[%d] + %lld", v->buf, (long long)v->offset);
    }
    const char *vn = pool_printf(g->pool, "v%d", k), *name = pool_printf(g->pool, "pk%d", k);
    view_text(g, o, vn, v);
    str_putf(&pk->allocs, "        float *%s = malloc(%lld * sizeof(float));\n", name,
             (long long)util_numel(v->rank, v->shape));
    str_putf(&pk->any_null, "%s!%s", pk->n ? " || " : "", name);
    str_putf(&pk->packs, "        kiln_pack(bufs[%d], &%s, %s);\n", v->buf, vn, name);
    str_putf(&pk->frees, "        free(%s);\n", name);
    pk->n++;
    return name;
}

static void shape4(Str *o, const char *name, const int64_t *s) {
    str_putf(o, "        static const int64_t %s[4] = {%lld, %lld, %lld, %lld};\n", name,
             (long long)s[0], (long long)s[1], (long long)s[2], (long long)s[3]);
}

/* The KilnRT entry of a conv: conv2d_const when its weight is a weight
 * buffer passed as it is (dense), so its address and data are the same on
 * every call and the library may keep the weight in its own layout; never
 * for a runtime input, a computed buffer or a packed copy. */
static const char *conv_entry(const Gen *g, const Buffer *b) {
    const BufView *w = &b->opnd[1];
    if (b->ext_op == OP_CONV2D && buf_of(g, w->buf)->body == BODY_WEIGHT && view_dense(w))
        return "conv2d_const";
    return op_info[b->ext_op].name;
}

static void conv_call(Gen *g, Str *o, const Buffer *b, const char *out, const char *epi) {
    Packs pk = {.n = 0};
    str_init(&pk.allocs, g->pool), str_init(&pk.packs, g->pool);
    str_init(&pk.frees, g->pool), str_init(&pk.any_null, g->pool);
    const char *x = conv_operand(g, o, &b->opnd[0], 0, &pk);
    const char *w = conv_operand(g, o, &b->opnd[1], 1, &pk);
    const char *bias = b->nopnds > 2 ? conv_operand(g, o, &b->opnd[2], 2, &pk) : "NULL";
    shape4(o, "xs", b->opnd[0].shape);
    shape4(o, "ws", b->opnd[1].shape);
    shape4(o, "ys", b->shape);
    str_putf(o, "        static const int64_t attr[%d] = {", b->nattr);
    for (int i = 0; i < b->nattr; i++) str_putf(o, "%s%lld", i ? ", " : "", (long long)b->attr[i]);
    str_putf(o, "};\n");
    if (pk.n) {
        str_putf(o, "%s        if (%s) {\n", str_get(&pk.allocs), str_get(&pk.any_null));
        cg_put_indented(o, str_get(&pk.frees), 4);
        str_putf(o, "            return 1;\n        }\n%s", str_get(&pk.packs));
    }
    str_putf(o, "        int rc = rt->%s(%s, xs, %s, ws, %s, %s, ys, attr, %s);\n",
             conv_entry(g, b), x, w, bias, out, epi);
    str_putf(o, "%s        if (rc) return 1;\n", str_get(&pk.frees));
}

/* Does the call pass an epilogue? */
static bool e_is_set(const char *epi) { return strcmp(epi, "NULL, NULL") != 0; }

static void mm_call(Gen *g, Str *o, const Buffer *b, const char *out, const char *epi) {
    view_text(g, o, "a", &b->opnd[0]);
    view_text(g, o, "b", &b->opnd[1]);
    str_putf(o, "        static const int64_t shape[%d] = {", b->rank > 0 ? b->rank : 1);
    for (int d = 0; d < b->rank; d++) str_putf(o, "%s%lld", d ? ", " : "", (long long)b->shape[d]);
    str_putf(o, "%s};\n", b->rank ? "" : "1");
    /* mm_const when b is a weight buffer: its address and data are the same
     * on every call, so the library may keep it in its own layout */
    bool wconst = buf_of(g, b->opnd[1].buf)->body == BODY_WEIGHT;
    if (b->dtype == KILN_F64) { /* dgemm: the operands are f64 too (the builder casts) */
        if (e_is_set(epi)) cg_fail(g, "codegen: an f64 matmul with an epilogue");
        str_putf(o,
                 "        if (rt->mm64((const double *)bufs[%d], &a, (const double *)bufs[%d], &b, "
                 "(double *)%s, %d, shape)) return 1;\n",
                 b->opnd[0].buf, b->opnd[1].buf, out, b->rank);
        return;
    }
    str_putf(o, "        if (rt->%s(bufs[%d], &a, bufs[%d], &b, %s, %d, shape, %s)) return 1;\n",
             wconst ? "mm_const" : "mm", b->opnd[0].buf, b->opnd[1].buf, out, b->rank, epi);
}

/* An f64 operand as the library's floats: each double a pair of floats,
 * one more dim of 2 (the gather copies bytes; it never reads the data as
 * numbers). The builder keeps such a view within KILN_MAX_RANK. */
static BufView as_float_pairs(BufView v) {
    for (int d = 0; d < v.rank; d++) v.stride[d] *= 2;
    v.offset *= 2;
    v.shape[v.rank] = 2;
    v.stride[v.rank++] = 1;
    return v;
}

/* A gather's index can be out of range: its message goes to rt->err and
 * the entry returns KILN_RT_ERR_INPUT. */
static void gather_call(Gen *g, Str *o, const Buffer *b, const char *out, const char *epi) {
    bool f64 = buf_of(g, b->opnd[0].buf)->dtype == KILN_F64;
    if (f64 && e_is_set(epi)) cg_fail(g, "codegen: an f64 gather with an epilogue");
    BufView dv = f64 ? as_float_pairs(b->opnd[0]) : b->opnd[0];
    view_text(g, o, "d", &dv);
    view_text(g, o, "ix", &b->opnd[1]);
    str_putf(o,
             "        int rc = rt->gather(bufs[%d], &d, bufs[%d], &ix, %d, %s, %s, rt->err, "
             "rt->errlen);\n",
             b->opnd[0].buf, b->opnd[1].buf, (int)b->attr[0], out, epi);
    str_putf(o, "        if (rc) return rc == %d ? %d : 1;\n", EXT_ERR_INPUT, KILN_RT_ERR_INPUT);
}

/* A call of sub-programs: the runtime runs them on the packed operand. */
static void subprogram_call(Gen *g, Str *o, const Buffer *b, const char *out) {
    const char *ty = b->dtype == KILN_F64 ? "double" : "float";
    str_putf(o,
             "        int rc = rt->call(rt->prog, %d, (const %s *)bufs[%d] + %lld, %s, rt->err, "
             "rt->errlen);\n",
             b->id, ty, b->opnd[0].buf, (long long)b->opnd[0].offset, out);
    str_putf(o, "        if (rc) return rc == %d ? %d : 1;\n", EXT_ERR_INPUT, KILN_RT_ERR_INPUT);
    (void)g;
}

/* The library call of extern kernel kidx; with an epilogue it writes the
 * epilogue's target and calls <prefix>epi_<k>_cb on each block. */
static void extern_call(Gen *g, Str *o, int kidx) {
    const Kernel *k = &g->s->kernels[kidx];
    const Buffer *b = buf_of(g, snode(g, k->members[0])->buf);
    const Epi *e = &g->epi[kidx];
    if (k->n > 1 && !e->fn) cg_fail(g, "codegen: extern kernel %s has no epilogue", k->kernel);
    uint8_t *use = pool_alloc(g->pool, (size_t)g->p->nbufs + 1);
    int target = e->fn ? e->target : b->id;
    str_putf(o, "    {   /* %s = %s(", g->bufname[target], k->kernel);
    for (int i = 0; i < b->nopnds; i++) {
        str_putf(o, "%s%s", i ? ", " : "", g->bufname[b->opnd[i].buf]);
        use[b->opnd[i].buf] |= USE_READ;
    }
    str_putf(o, ")%s%s */\n", e->fn ? ", epilogue " : "", e->fn ? e->fn : "");
    for (int i = 0; e->fn && i < g->p->nbufs; i++) use[i] |= e->use[i];
    use[target] |= USE_WRITE;
    const char *out = pool_printf(g->pool, "bufs[%d]", target);
    const char *epi = e->fn ? pool_printf(g->pool, "%s_cb, (void *)bufs", e->fn) : "NULL, NULL";
    if (b->ext_op == OP_CONV2D || b->ext_op == OP_CONV_TRANSPOSE2D)
        conv_call(g, o, b, out, epi);
    else if (b->ext_op == OP_GATHER)
        gather_call(g, o, b, out, epi);
    else if (b->ext_op == OP_MATMUL)
        mm_call(g, o, b, out, epi);
    else if (b->ext_op == OP_CALL)
        subprogram_call(g, o, b, out);
    else
        cg_fail(g, "codegen: unknown extern %s", op_info[b->ext_op].name);
    str_putf(o, "    }\n");
    g->calls[kidx] = cg_make_call(g, kidx, use, false, g->calls[kidx].inner_loops);
}

void cg_entry_text(Gen *g, const bool *returns_int) {
    Str o;
    str_init(&o, g->pool);
    str_putf(&o, "%s\n", CG_ENTRY_COMMENT);
    str_putf(&o, "int %skiln_entry(float *const *bufs, const KilnRT *rt)\n{\n", g->prefix);
    /* the profiler (KilnRT.prof, NULL when off): a hook around each call,
     * and for the threads of the parallel regions */
    str_putf(&o, "    atomic_store_explicit(&kiln_prof_now, rt->prof, memory_order_relaxed);\n");
    for (int k = 0; k < g->s->nkernels; k++) {
        const CgCall *c = &g->calls[k];
        str_putf(&o, "    KILN_PROF(rt, %d, KILN_PROF_BEGIN);\n", k);
        if (g->s->kernels[k].kind == KK_EXTERN) {
            extern_call(g, &o, k);
            str_putf(&o, "    KILN_PROF(rt, %d, KILN_PROF_END);\n", k);
            continue;
        }
        str_putf(&o, "    %s%s%s(", returns_int[k] ? "if (" : "", g->prefix, c->name);
        for (int i = 0; i < c->nbufs; i++)
            str_putf(&o, "%s%sbufs[%d]", i ? ", " : "",
                     g->p->bufs[c->bufs[i]]->dtype == KILN_F64 ? "(double *)" : "", c->bufs[i]);
        str_putf(&o, ")%s   /*", returns_int[k] ? ") return 1;" : ";");
        for (int i = 0; i < c->nbufs; i++) str_putf(&o, " %s", g->bufname[c->bufs[i]]);
        str_putf(&o, " */\n    KILN_PROF(rt, %d, KILN_PROF_END);\n", k);
    }
    str_putf(&o, "    return 0;\n}\n");
    str_putf(&g->out, "%s", str_get(&o));
}
