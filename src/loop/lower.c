/*
 * lower.c -- decomposed graph -> loop IR.   requires: a graph with no
 * composite op; gives: buffers in program order, each with a loop body.
 *
 * Every graph value gets a *value function*: an expression over the value's
 * own index variables v0..v(rank-1) that computes one element. An input's is
 * `load(x, contiguous index)`; a pointwise op's applies the op to its
 * operands' functions, each with its variables renamed for broadcasting; a
 * view's is its operand's function with the variables replaced by index
 * expressions (permute renames them, slice scales and shifts them, expand
 * maps a broadcast dim to 0, reshape goes through the flat index with floor
 * division and modulo). The index simplifier brings every index to a
 * canonical form, so a reshape of a contiguous buffer stays affine and two
 * reads of the same element print the same. A constant pad and a concat are
 * views with a *select*: `0 <= v - before < n ? x(v - before) : value`, and
 * `v < n0 ? a(v) : b(v - n0)`; the simplifier drops a comparison the index's
 * range decides, so a slice of a pad's interior reads x with no test.
 *
 * A value whose function is substituted into its consumers is *inlined*
 * (recomputed in each); one that must exist in memory is *materialized*: it
 * becomes a Buffer and its function becomes a load of that buffer.
 * Reductions, externs and random values always are; a pointwise value is
 * unless none of the rules in `materialize_rules` objects. That is the first
 * and cheapest fusion: `sin(relu(x + 1) * 2)` is one buffer before the
 * scheduler runs.
 *
 * The first part of this file is the Pool, the index algebra and the
 * expressions the lowering is built from (loop.h documents them).
 */
#include "loop/loop.h"
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ===== Index: construction ================================================== */

static Index *ix_new(Pool *p, IndexKind k, int64_t v, int n) {
    Index *ix = pool_alloc(p, sizeof *ix);
    ix->kind = k;
    ix->v = v;
    ix->n = n;
    if (n) ix->a = pool_alloc(p, sizeof(Index *) * (size_t)n);
    return ix;
}

Index *ix_var(Pool *p, int v) { return ix_new(p, IX_VAR, v, 0); }
Index *ix_const(Pool *p, int64_t c) { return ix_new(p, IX_CONST, c, 0); }

Index *ix_add(Pool *p, Index *a, Index *b) {
    Index *ix = ix_new(p, IX_ADD, 0, 2);
    ix->a[0] = a;
    ix->a[1] = b;
    return ix;
}

static Index *ix_unary(Pool *p, IndexKind k, Index *a, int64_t c) {
    Index *ix = ix_new(p, k, c, 1);
    ix->a[0] = a;
    return ix;
}

Index *ix_mul(Pool *p, Index *a, int64_t c) { return ix_unary(p, IX_MUL, a, c); }
Index *ix_div(Pool *p, Index *a, int64_t c) { return ix_unary(p, IX_FLOORDIV, a, c); }
Index *ix_mod(Pool *p, Index *a, int64_t c) { return ix_unary(p, IX_MOD, a, c); }

Index *ix_subst(Pool *p, const Index *ix, Index *const *map) {
    if (ix->kind == IX_VAR) return map[ix->v];
    if (ix->kind == IX_CONST) return (Index *)ix;
    Index *r = ix_new(p, ix->kind, ix->v, ix->n);
    for (int i = 0; i < ix->n; i++) r->a[i] = ix_subst(p, ix->a[i], map);
    return r;
}

int ix_cmp(const Index *a, const Index *b) {
    if (a->kind != b->kind) return a->kind < b->kind ? -1 : 1;
    if (a->v != b->v) return a->v < b->v ? -1 : 1;
    if (a->n != b->n) return a->n < b->n ? -1 : 1;
    for (int i = 0; i < a->n; i++) {
        int c = ix_cmp(a->a[i], b->a[i]);
        if (c) return c;
    }
    return 0;
}

uint32_t ix_vars(const Index *ix) {
    if (ix->kind == IX_VAR) return ix->v < 32 ? (uint32_t)1 << ix->v : 0;
    uint32_t m = 0;
    for (int i = 0; i < ix->n; i++) m |= ix_vars(ix->a[i]);
    return m;
}

Index *ix_contiguous(Pool *p, int rank, const int64_t *shape, Index *const *vars) {
    Index *sum = ix_const(p, 0);
    int64_t stride = 1;
    for (int d = rank - 1; d >= 0; d--) {
        if (shape[d] != 1) sum = ix_add(p, sum, ix_mul(p, vars[d], stride));
        stride *= shape[d];
    }
    return sum;
}

/* ===== Index: the simplifier =================================================
 * An index is brought to a linear combination of *atoms* (a variable, a
 * floor division or a modulo of a canonical index) plus a constant; the
 * atoms are sorted and each division or modulo is folded away when the
 * range of its operand allows. Ranges are intervals computed from the
 * variables' ranges, saturating instead of overflowing. */

typedef struct {
    int64_t k;
    Index *atom;
} Term;
typedef struct {
    int n, cap;
    Term *t;
    int64_t c;
} Lin;
typedef struct {
    Pool *p;
    int nv;
    const int64_t *r;
} Simp;

#define BIG ((int64_t)1 << 61)

static int64_t sat(int64_t v) { return v > BIG ? BIG : v < -BIG ? -BIG : v; }
static int64_t sadd(int64_t a, int64_t b) { return sat(a + b); } /* |a|,|b| <= BIG */
static int64_t smul(int64_t a, int64_t b) {
    int64_t r;
    if (__builtin_mul_overflow(a, b, &r)) return (a < 0) != (b < 0) ? -BIG : BIG;
    return sat(r);
}
static int64_t fdiv(int64_t a, int64_t d) {
    int64_t q = a / d;
    return (a % d != 0 && (a < 0) != (d < 0)) ? q - 1 : q;
}
static int64_t fmodi(int64_t a, int64_t d) { return a - fdiv(a, d) * d; }
static int64_t gcd64(int64_t a, int64_t b) {
    a = a < 0 ? -a : a;
    b = b < 0 ? -b : b;
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static void ix_range(const Simp *S, const Index *ix, int64_t *lo, int64_t *hi) {
    int64_t l, h;
    switch (ix->kind) {
    case IX_VAR:
        *lo = 0;
        *hi = ix->v < S->nv ? S->r[ix->v] - 1 : BIG;
        return;
    case IX_CONST: *lo = *hi = sat(ix->v); return;
    case IX_ADD:
        *lo = *hi = 0;
        for (int i = 0; i < ix->n; i++) {
            ix_range(S, ix->a[i], &l, &h);
            *lo = sadd(*lo, l);
            *hi = sadd(*hi, h);
        }
        return;
    case IX_MUL:
        ix_range(S, ix->a[0], &l, &h);
        *lo = smul(l, ix->v);
        *hi = smul(h, ix->v);
        if (ix->v < 0) {
            int64_t t = *lo;
            *lo = *hi;
            *hi = t;
        }
        return;
    case IX_FLOORDIV:
        ix_range(S, ix->a[0], &l, &h);
        *lo = fdiv(l, ix->v);
        *hi = fdiv(h, ix->v);
        return;
    case IX_MOD:
        ix_range(S, ix->a[0], &l, &h);
        if (l >= 0 && h < ix->v) {
            *lo = l;
            *hi = h;
        } else {
            *lo = 0;
            *hi = ix->v - 1;
        }
        return;
    }
}

static void lin_push(const Simp *S, Lin *L, int64_t k, Index *atom) {
    if (k == 0) return;
    for (int i = 0; i < L->n; i++)
        if (ix_cmp(L->t[i].atom, atom) == 0) {
            L->t[i].k += k;
            return;
        }
    L->t = pool_grow(S->p, L->t, &L->cap, L->n + 1, sizeof(Term));
    L->t[L->n].k = k;
    L->t[L->n].atom = atom;
    L->n++;
}

static void lin_addlin(const Simp *S, Lin *d, const Lin *s, int64_t scale) {
    for (int i = 0; i < s->n; i++) lin_push(S, d, s->t[i].k * scale, s->t[i].atom);
    d->c += s->c * scale;
}

static void lin_range(const Simp *S, const Lin *L, int64_t *lo, int64_t *hi) {
    *lo = *hi = sat(L->c);
    for (int i = 0; i < L->n; i++) {
        int64_t l, h;
        ix_range(S, L->t[i].atom, &l, &h);
        int64_t a = smul(l, L->t[i].k), b = smul(h, L->t[i].k);
        *lo = sadd(*lo, a < b ? a : b);
        *hi = sadd(*hi, a < b ? b : a);
    }
}

static int term_cmp(const void *a, const void *b) {
    return ix_cmp(((const Term *)a)->atom, ((const Term *)b)->atom);
}

static Lin lin_from(const Simp *S, const Index *ix);
static Index *lin_build(const Simp *S, Lin *L);

/* The canonical atom (or constant) of e // d, as a Lin. */
static Lin lin_floordiv(const Simp *S, Lin L, int64_t d);

/* (E//b)*b*m + (E%b)*m -> E*m, also when E//b canonicalizes to a nested
 * division ((f//c)//b -> f//(b*c)), so reshapes of contiguous data stay affine. */
static bool lin_recombine_once(const Simp *S, Lin *L) {
    for (int j = 0; j < L->n; j++) {
        Index *m = L->t[j].atom;
        if (m->kind != IX_MOD || L->t[j].k == 0) continue;
        int64_t b = m->v, k = L->t[j].k;
        Lin q = lin_floordiv(S, lin_from(S, m->a[0]), b);
        if (q.n != 1 || q.c != 0 || q.t[0].k != 1) continue;
        for (int i = 0; i < L->n; i++) {
            if (i == j || L->t[i].k != k * b || ix_cmp(L->t[i].atom, q.t[0].atom) != 0) continue;
            L->t[i].k = 0;
            L->t[j].k = 0;
            Lin e = lin_from(S, m->a[0]);
            lin_addlin(S, L, &e, k);
            return true;
        }
    }
    return false;
}

static void lin_normalize(const Simp *S, Lin *L) {
    while (lin_recombine_once(S, L)) {}
    int w = 0;
    for (int i = 0; i < L->n; i++)
        if (L->t[i].k != 0) L->t[w++] = L->t[i];
    L->n = w;
    if (L->n > 1) qsort(L->t, (size_t)L->n, sizeof(Term), term_cmp);
}

static Lin lin_atom(const Simp *S, IndexKind k, Lin inner, int64_t d) {
    Lin r = {0};
    lin_push(S, &r, 1, ix_unary(S->p, k, lin_build(S, &inner), d));
    return r;
}

static Lin lin_scaled(const Simp *S, const Lin *L, int64_t num, int64_t den) {
    Lin r = {0};
    for (int i = 0; i < L->n; i++) lin_push(S, &r, L->t[i].k / den * num, L->t[i].atom);
    r.c = L->c / den * num;
    return r;
}

/* Split L (no constant) into g*B + R with 0 <= R < g, g > 1 dividing d:
 * B from the terms with the largest coefficients, R the rest plus c. Then
 * (g*B + R)//d = B//(d/g) and (g*B + R)%d = g*(B%(d/g)) + R, as when a
 * reshape's flat index 8*v0 + v1 (v1 < 8) is divided by 48. */
static int cmp_abs_desc(const void *a, const void *b) {
    int64_t x = ((const Term *)a)->k, y = ((const Term *)b)->k;
    x = x < 0 ? -x : x;
    y = y < 0 ? -y : y;
    return x > y ? -1 : x < y;
}

static int64_t split_common(const Simp *S, const Lin *L, int64_t d, Lin *big, Lin *small) {
    Term *t = pool_alloc(S->p, sizeof(Term) * (size_t)(L->n + 1));
    memcpy(t, L->t, sizeof(Term) * (size_t)L->n);
    qsort(t, (size_t)L->n, sizeof(Term), cmp_abs_desc);
    int64_t g = d;
    for (int k = 1; k <= L->n; k++) {
        g = gcd64(g, t[k - 1].k);
        if (g <= 1) return 0;
        Lin r = {0};
        for (int i = k; i < L->n; i++) lin_push(S, &r, t[i].k, t[i].atom);
        r.c = L->c;
        int64_t lo, hi;
        lin_range(S, &r, &lo, &hi);
        if (lo < 0 || hi >= g) continue;
        Lin b = {0};
        for (int i = 0; i < k; i++) lin_push(S, &b, t[i].k / g, t[i].atom);
        *big = b;
        *small = r;
        return g;
    }
    return 0;
}

static Lin lin_floordiv(const Simp *S, Lin L, int64_t d) {
    lin_normalize(S, &L);
    if (d == 1) return L;
    if (d <= 0) return lin_atom(S, IX_FLOORDIV, L, d);
    Lin q = {0}, rm = {0};
    for (int i = 0; i < L.n; i++) {
        if (L.t[i].k % d == 0)
            lin_push(S, &q, L.t[i].k / d, L.t[i].atom);
        else
            lin_push(S, &rm, L.t[i].k, L.t[i].atom);
    }
    q.c = fdiv(L.c, d);
    rm.c = fmodi(L.c, d);
    int64_t lo, hi;
    lin_range(S, &rm, &lo, &hi);
    if (fdiv(lo, d) == fdiv(hi, d)) { /* floor(rm/d) is a constant */
        q.c += fdiv(lo, d);
        return q;
    }
    Lin big, small;
    int64_t g = split_common(S, &rm, d, &big, &small);
    if (g > 1) {
        Lin inner = lin_floordiv(S, big, d / g);
        lin_addlin(S, &q, &inner, 1);
        return q;
    }
    g = d;
    for (int i = 0; i < rm.n; i++) g = gcd64(g, rm.t[i].k);
    g = gcd64(g, rm.c);
    if (g > 1) {
        rm = lin_scaled(S, &rm, 1, g);
        d /= g;
    }
    Lin inner;
    if (rm.n == 1 && rm.c == 0 && rm.t[0].k == 1 && rm.t[0].atom->kind == IX_FLOORDIV) {
        inner = lin_floordiv(S, lin_from(S, rm.t[0].atom->a[0]), rm.t[0].atom->v * d);
    } else {
        inner = lin_atom(S, IX_FLOORDIV, rm, d);
    }
    lin_addlin(S, &q, &inner, 1);
    return q;
}

static Lin lin_modulo(const Simp *S, Lin L, int64_t d) {
    lin_normalize(S, &L);
    Lin r = {0};
    if (d == 1) return r;
    if (d <= 0) return lin_atom(S, IX_MOD, L, d);
    for (int i = 0; i < L.n; i++) lin_push(S, &r, fmodi(L.t[i].k, d), L.t[i].atom);
    r.c = fmodi(L.c, d);
    lin_normalize(S, &r);
    int64_t lo, hi;
    lin_range(S, &r, &lo, &hi);
    if (fdiv(lo, d) == fdiv(hi, d)) { /* r - d*floor(r/d), the floor constant */
        r.c -= d * fdiv(lo, d);
        return r;
    }
    Lin big, small;
    int64_t g = split_common(S, &r, d, &big, &small);
    if (g > 1) {
        Lin inner = lin_modulo(S, big, d / g);
        Lin out = lin_scaled(S, &inner, g, 1);
        lin_addlin(S, &out, &small, 1);
        return out;
    }
    g = d;
    for (int i = 0; i < r.n; i++) g = gcd64(g, r.t[i].k);
    g = gcd64(g, r.c);
    if (g > 1) { /* (g*x) mod (g*e) = g * (x mod e) */
        Lin inner = lin_modulo(S, lin_scaled(S, &r, 1, g), d / g);
        return lin_scaled(S, &inner, g, 1);
    }
    if (r.n == 1 && r.c == 0 && r.t[0].k == 1 && r.t[0].atom->kind == IX_MOD &&
        r.t[0].atom->v % d == 0) /* (e mod a) mod d = e mod d when d | a */
        return lin_modulo(S, lin_from(S, r.t[0].atom->a[0]), d);
    return lin_atom(S, IX_MOD, r, d);
}

static Lin lin_from(const Simp *S, const Index *ix) {
    Lin L = {0};
    switch (ix->kind) {
    case IX_VAR:
        if (!(ix->v < S->nv && S->r[ix->v] <= 1)) lin_push(S, &L, 1, ix_var(S->p, (int)ix->v));
        return L;
    case IX_CONST: L.c = ix->v; return L;
    case IX_ADD:
        for (int i = 0; i < ix->n; i++) {
            Lin a = lin_from(S, ix->a[i]);
            lin_addlin(S, &L, &a, 1);
        }
        lin_normalize(S, &L);
        return L;
    case IX_MUL: {
        Lin a = lin_from(S, ix->a[0]);
        lin_addlin(S, &L, &a, ix->v);
        lin_normalize(S, &L);
        return L;
    }
    case IX_FLOORDIV: return lin_floordiv(S, lin_from(S, ix->a[0]), ix->v);
    case IX_MOD: return lin_modulo(S, lin_from(S, ix->a[0]), ix->v);
    }
    return L;
}

static Index *lin_build(const Simp *S, Lin *L) {
    lin_normalize(S, L);
    int n = L->n + (L->c != 0);
    if (n == 0) return ix_const(S->p, 0);
    Index *ix = n == 1 ? NULL : ix_new(S->p, IX_ADD, 0, n);
    for (int i = 0; i < L->n; i++) {
        Index *t = L->t[i].k == 1 ? L->t[i].atom : ix_mul(S->p, L->t[i].atom, L->t[i].k);
        if (!ix) return t;
        ix->a[i] = t;
    }
    if (!ix) return ix_const(S->p, L->c);
    if (L->c) ix->a[L->n] = ix_const(S->p, L->c);
    return ix;
}

Index *ix_simplify(Pool *p, const Index *ix, int nvars, const int64_t *ranges) {
    Simp S = {p, nvars, ranges};
    Lin L = lin_from(&S, ix);
    return lin_build(&S, &L);
}

bool ix_affine(const Index *ix, int nvars, int64_t *coef, int64_t *offset) {
    for (int v = 0; v < nvars; v++) coef[v] = 0;
    *offset = 0;
    const Index *one[1] = {ix};
    Index *const *terms = ix->kind == IX_ADD ? ix->a : (Index *const *)one;
    int n = ix->kind == IX_ADD ? ix->n : 1;
    for (int i = 0; i < n; i++) {
        const Index *t = terms[i];
        int64_t k = 1;
        if (t->kind == IX_CONST) {
            *offset += t->v;
            continue;
        }
        if (t->kind == IX_MUL) {
            k = t->v;
            t = t->a[0];
        }
        if (t->kind != IX_VAR || t->v >= nvars) return false;
        coef[t->v] += k;
    }
    return true;
}

/* ===== Index: printing ===================================================== */

static void ix_print_inner(Str *s, const Index *ix) {
    if (ix->kind == IX_ADD) {
        str_putf(s, "(");
        ix_print(s, ix);
        str_putf(s, ")");
    } else
        ix_print(s, ix);
}

static void ix_print_term(Str *s, const Index *t, bool first) {
    int64_t k = t->kind == IX_MUL ? t->v : t->kind == IX_CONST ? t->v : 1;
    if (!first)
        str_putf(s, k < 0 ? " - " : " + ");
    else if (k < 0)
        str_putf(s, "-");
    int64_t ak = k < 0 ? -k : k;
    if (t->kind == IX_CONST) {
        str_putf(s, "%lld", (long long)ak);
        return;
    }
    if (t->kind == IX_MUL) {
        str_putf(s, "%lld*", (long long)ak);
        ix_print_inner(s, t->a[0]);
        return;
    }
    ix_print(s, t);
}

void ix_print(Str *s, const Index *ix) {
    switch (ix->kind) {
    case IX_VAR: str_putf(s, "v%lld", (long long)ix->v); return;
    case IX_CONST: str_putf(s, "%lld", (long long)ix->v); return;
    case IX_MUL: ix_print_term(s, ix, true); return;
    case IX_ADD:
        for (int i = 0; i < ix->n; i++) ix_print_term(s, ix->a[i], i == 0);
        return;
    case IX_FLOORDIV:
    case IX_MOD:
        str_putf(s, "(");
        ix_print_inner(s, ix->a[0]);
        str_putf(s, "%s%lld)", ix->kind == IX_MOD ? "%" : "//", (long long)ix->v);
        return;
    }
}

const char *ix_str(Pool *p, const Index *ix) {
    Str s;
    str_init(&s, p);
    ix_print(&s, ix);
    return str_get(&s);
}

/* ===== Expr ============================================================== */

static Expr *ex_new(Pool *p, ExprKind k, kiln_dtype dt) {
    Expr *e = pool_alloc(p, sizeof *e);
    e->kind = k;
    e->dtype = dt;
    return e;
}

Expr *ex_load(Pool *p, int buf, Index *index, kiln_dtype dt) {
    Expr *e = ex_new(p, EX_LOAD, dt);
    e->buf = buf;
    e->index = index;
    return e;
}

Expr *ex_const(Pool *p, double v) {
    Expr *e = ex_new(p, EX_CONST, KILN_F32);
    e->value = v;
    return e;
}

bool ex_op_f64(const Expr *e) {
    if (e->dtype == KILN_F64) return true;
    if (e->kind != EX_OP || e->op == OP_CAST) return false;
    for (int i = 0; i < e->nargs; i++)
        if (e->args[i]->dtype == KILN_F64) return true;
    return false;
}

static Expr *as_f64(Pool *p, Expr *a) {
    if (a->kind != EX_CONST || a->dtype == KILN_F64) return a;
    Expr *c = ex_const(p, a->value);
    c->dtype = KILN_F64;
    return c;
}

bool ex_has_f64(const Expr *e, bool loads) {
    if (e->kind == EX_LOAD) return loads && e->dtype == KILN_F64;
    if (e->dtype == KILN_F64) return true;
    for (int i = 0; e->kind != EX_CONST && i < e->nargs; i++)
        if (ex_has_f64(e->args[i], loads)) return true;
    return false;
}

/* A constant operand takes the type its op computes in (ex_op_f64): a
 * scalar is weak, as in PyTorch, and 0.1 in an f64 expression is the double
 * 0.1, not the float. A cast's operand keeps its own type. */
Expr *ex_op(Pool *p, Op op, kiln_dtype dt, int nargs, Expr *const *args) {
    Expr *e = ex_new(p, EX_OP, dt);
    e->op = op;
    e->nargs = nargs;
    e->args = pool_alloc(p, sizeof(Expr *) * (size_t)(nargs ? nargs : 1));
    for (int i = 0; i < nargs; i++) e->args[i] = args[i];
    if (op != OP_CAST && ex_op_f64(e))
        for (int i = 0; i < nargs; i++) e->args[i] = as_f64(p, args[i]);
    return e;
}

/* Which branch a select's predicate takes over the ranges: 0 or 1, or -1
 * when it varies; the bounds the range satisfies become absent. */
static int select_decide(const Simp *S, const Index *ix, int64_t *lo, int64_t *hi) {
    int64_t l, h;
    ix_range(S, ix, &l, &h);
    if ((*lo != EX_NOLO && h < *lo) || (*hi != EX_NOHI && l >= *hi)) return 1;
    if (*lo != EX_NOLO && l >= *lo) *lo = EX_NOLO;
    if (*hi != EX_NOHI && h < *hi) *hi = EX_NOHI;
    return *lo == EX_NOLO && *hi == EX_NOHI ? 0 : -1;
}

static Expr *select_new(Pool *p, Index *ix, int64_t lo, int64_t hi, Expr *a, Expr *b) {
    Expr *args[2] = {a, b};
    bool f64 = a->dtype == KILN_F64 || b->dtype == KILN_F64;
    Expr *e = ex_op(p, OP_COUNT, f64 ? KILN_F64 : a->dtype, 2, args);
    e->kind = EX_SELECT;
    e->index = ix;
    e->lo = lo;
    e->hi = hi;
    return e;
}

Expr *ex_select(Pool *p, Index *index, int64_t lo, int64_t hi, Expr *a, Expr *b, int nvars,
                const int64_t *ranges) {
    Simp S = {p, nvars, ranges};
    Index *ix = ix_simplify(p, index, nvars, ranges);
    int k = select_decide(&S, ix, &lo, &hi);
    return k == 0 ? a : k == 1 ? b : select_new(p, ix, lo, hi, a, b);
}

/* A select whose branch is decided by the new ranges keeps only that branch. */
static Expr *subst_select(Pool *p, const Expr *e, Index *const *map, int nvars,
                          const int64_t *ranges) {
    Simp S = {p, nvars, ranges};
    int64_t lo = e->lo, hi = e->hi;
    Index *ix = ix_simplify(p, ix_subst(p, e->index, map), nvars, ranges);
    int k = select_decide(&S, ix, &lo, &hi);
    if (k >= 0) return ex_subst(p, e->args[k], map, nvars, ranges);
    return select_new(p, ix, lo, hi, ex_subst(p, e->args[0], map, nvars, ranges),
                      ex_subst(p, e->args[1], map, nvars, ranges));
}

Expr *ex_subst(Pool *p, const Expr *e, Index *const *map, int nvars, const int64_t *ranges) {
    switch (e->kind) {
    case EX_SELECT: return subst_select(p, e, map, nvars, ranges);
    case EX_CONST: return (Expr *)e; /* immutable: shared */
    case EX_LOAD:
        return ex_load(p, e->buf, ix_simplify(p, ix_subst(p, e->index, map), nvars, ranges),
                       e->dtype);
    case EX_OP: {
        Expr *args[MAX_IN];
        for (int i = 0; i < e->nargs; i++) args[i] = ex_subst(p, e->args[i], map, nvars, ranges);
        return ex_op(p, e->op, e->dtype, e->nargs, args);
    }
    }
    return NULL;
}

/* A select is not counted: it picks a value by index arithmetic, as a
 * load's address does, and a pool's window would otherwise count each tap's
 * border test against max_inline_ops. */
int ex_nops(const Expr *e) {
    int n = e->kind == EX_OP;
    for (int i = 0; e->kind >= EX_OP && i < e->nargs; i++) n += ex_nops(e->args[i]);
    return n;
}

/* Transcendental ops: tens of instructions each, worth a buffer when the
 * value is used twice (Inductor realizes softmax's exp for the same reason). */
int ex_expensive(const Expr *e) {
    if (e->kind < EX_OP) return -1;
    if (e->kind == EX_OP && op_info[e->op].expensive) return (int)e->op;
    for (int i = 0; i < e->nargs; i++) {
        int r = ex_expensive(e->args[i]);
        if (r >= 0) return r;
    }
    return -1;
}

int ex_regs(const Expr *e) {
    if (e->kind < EX_OP || e->nargs == 0) return 1;
    int need[MAX_IN];
    for (int i = 0; i < e->nargs; i++) need[i] = ex_regs(e->args[i]);
    for (int i = 1; i < e->nargs; i++) /* descending: hardest first */
        for (int j = i; j > 0 && need[j] > need[j - 1]; j--) {
            int t = need[j];
            need[j] = need[j - 1];
            need[j - 1] = t;
        }
    int r = 0;
    for (int i = 0; i < e->nargs; i++)
        if (need[i] + i > r) r = need[i] + i;
    return r;
}

void ex_loads(const Expr *e, void (*fn)(const Expr *load, void *ud), void *ud) {
    if (e->kind == EX_LOAD) fn(e, ud);
    for (int i = 0; e->kind >= EX_OP && i < e->nargs; i++) ex_loads(e->args[i], fn, ud);
}

void ex_selects(const Expr *e, void (*fn)(const Expr *sel, void *ud), void *ud) {
    if (e->kind == EX_SELECT) fn(e, ud);
    for (int i = 0; e->kind >= EX_OP && i < e->nargs; i++) ex_selects(e->args[i], fn, ud);
}

/* ---- printing ------------------------------------------------------------ */

static int infix_prec(Op op, const char **sym) {
    switch (op) {
    case OP_ADD: *sym = "+"; return 1;
    case OP_SUB: *sym = "-"; return 1;
    case OP_MUL: *sym = "*"; return 2;
    case OP_DIV: *sym = "/"; return 2;
    default: return 0;
    }
}

static void print_number(Str *s, double v) {
    char b[64];
    snprintf(b, sizeof b, "%.9g", v);
    str_putf(s, "%s%s", b, strpbrk(b, ".eni") ? "" : ".0");
}

/* ctx: the precedence the surrounding context needs (parenthesize below it). */
static void ex_print_prec(Str *s, const LoopProgram *p, const Expr *e, int ctx) {
    if (e->kind == EX_CONST) {
        print_number(s, e->value);
        return;
    }
    if (e->kind == EX_LOAD) {
        str_putf(s, "load(%s, ", p->bufs[e->buf]->name);
        ix_print(s, e->index);
        str_putf(s, ")");
        return;
    }
    if (e->kind == EX_SELECT) {
        str_putf(s, "select(");
        if (e->lo != EX_NOLO) str_putf(s, "%lld <= ", (long long)e->lo);
        ix_print(s, e->index);
        if (e->hi != EX_NOHI) str_putf(s, " < %lld", (long long)e->hi);
        for (int i = 0; i < 2; i++) {
            str_putf(s, ", ");
            ex_print_prec(s, p, e->args[i], 0);
        }
        str_putf(s, ")");
        return;
    }
    const char *sym;
    int prec = infix_prec(e->op, &sym);
    if (prec && e->nargs == 2) {
        if (prec < ctx) str_putf(s, "(");
        ex_print_prec(s, p, e->args[0], prec);
        str_putf(s, " %s ", sym);
        ex_print_prec(s, p, e->args[1], prec + (e->op == OP_SUB || e->op == OP_DIV));
        if (prec < ctx) str_putf(s, ")");
        return;
    }
    str_putf(s, "%s(", e->op == OP_CAST ? kiln_dtype_name(e->dtype) : op_info[e->op].name);
    for (int i = 0; i < e->nargs; i++) {
        if (i) str_putf(s, ", ");
        ex_print_prec(s, p, e->args[i], 0);
    }
    str_putf(s, ")");
}

void ex_print(Str *s, const LoopProgram *p, const Expr *e) { ex_print_prec(s, p, e, 0); }

/* ===== lowering ============================================================== */

typedef struct {
    Expr *fn;   /* over the value's own dims; NULL until lowered */
    int buf;    /* the buffer holding it, or -1 */
    int ncover; /* graph nodes computed in fn (not behind a load) */
    int *cover;
} Val;

typedef struct {
    Pool *pool;
    const Graph *g;
    const KilnConfig *cfg;
    LoopProgram *p;
    Val *val;
    int *uses;      /* consumers of each value, counted through views */
    bool *ext_read; /* an extern reads it, directly or through views */
    int *nout;      /* times it is a program output */
    char *err;
    size_t errlen;
    jmp_buf jb;
} Lower;

static void lower_fail(Lower *L, const char *fmt, ...)
    __attribute__((format(printf, 2, 3), noreturn));
static void lower_fail(Lower *L, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (L->errlen) vsnprintf(L->err, L->errlen, fmt, ap);
    va_end(ap);
    longjmp(L->jb, 2);
}

static const char *node_origin(const Node *n) {
    return n->origin ? n->origin : op_info[n->op].name;
}

/* ---- analysis: liveness, users, extern readers ------------------------------ */

static void analyze(Lower *L) {
    const Graph *g = L->g;
    for (int i = 0; i < g->noutputs; i++) L->nout[g->outputs[i]]++;
    for (int i = g->n - 1; i >= 0; i--) {
        const Node *n = &g->nodes[i];
        L->p->live[i] = L->nout[i] > 0 || L->uses[i] > 0 || n->op == OP_INPUT;
        if (!L->p->live[i]) continue;
        L->uses[i] += L->nout[i];
        OpKind k = op_info[n->op].kind;
        for (int j = 0; j < n->nin; j++) {
            int o = n->in[j];
            if (o < 0) continue;
            /* every use of a view is a use of what it views, unless the view
             * is an output: then it is copied once and its users read the copy */
            bool through = k == KIND_VIEW && !L->nout[i];
            L->uses[o] += through ? (n->flags & NF_TAP ? 0 : L->uses[i]) : 1;
            if (k == KIND_EXTERN || (through && L->ext_read[i])) L->ext_read[o] = true;
        }
    }
}

/* ---- buffers and value functions --------------------------------------------- */

static void vars(Lower *L, int n, Index **v) {
    for (int i = 0; i < n; i++) v[i] = ix_var(L->pool, i);
}

static Buffer *new_buffer(Lower *L, int node, BodyKind body) {
    LoopProgram *p = L->p;
    const Node *n = graph_node(L->g, node);
    p->bufs = pool_grow(&p->pool, p->bufs, &p->capbufs, p->nbufs + 1, sizeof(Buffer *));
    Buffer *b = pool_alloc(L->pool, sizeof *b);
    b->id = p->nbufs;
    b->body = body;
    b->node = node;
    b->dtype = n->dtype;
    b->rank = n->rank;
    memcpy(b->shape, n->shape, sizeof b->shape);
    b->numel = node_numel(n);
    b->is_output = L->nout[node] > 0;
    if (buf_computed(b))
        b->name = pool_printf(L->pool, "buf%d", p->ncomputed++);
    else
        b->name = pool_strdup(L->pool, n->name ? n->name : "?");
    p->bufs[p->nbufs++] = b;
    p->node_buf[node] = b->id;
    return b;
}

/* The size-1-free iteration sizes of a shape; map[d] is the variable of dim d
 * (or 0 for a size-1 dim). */
static int squeeze(Lower *L, int rank, const int64_t *shape, int64_t *size, Index **map) {
    int k = 0;
    for (int d = 0; d < rank; d++) {
        if (shape[d] == 1) {
            map[d] = ix_const(L->pool, 0);
            continue;
        }
        map[d] = ix_var(L->pool, k);
        size[k++] = shape[d];
    }
    return k;
}

/* The value function of a buffer: a load at the contiguous index. */
static void set_loaded(Lower *L, int node, const Buffer *b) {
    const Node *n = graph_node(L->g, node);
    Index *v[KILN_MAX_RANK];
    vars(L, n->rank, v);
    Index *ix =
        ix_simplify(L->pool, ix_contiguous(L->pool, n->rank, n->shape, v), n->rank, n->shape);
    Val *val = &L->val[node];
    val->fn = ex_load(L->pool, b->id, ix, b->dtype);
    val->buf = b->id;
    val->ncover = 0;
    val->cover = NULL;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Origins: the sorted, unique origin names of the nodes a buffer covers. */
static void set_cover(Lower *L, Buffer *b, int n, const int *cover) {
    b->ncover = n;
    b->cover = pool_alloc(L->pool, sizeof(int) * (size_t)(n ? n : 1));
    if (n) memcpy(b->cover, cover, sizeof(int) * (size_t)n); /* cover is NULL when n is 0 */
    const char **o = pool_alloc(L->pool, sizeof(char *) * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) o[i] = node_origin(graph_node(L->g, cover[i]));
    if (n) qsort(o, (size_t)n, sizeof(char *), cmp_str);
    int w = 0;
    for (int i = 0; i < n; i++)
        if (w == 0 || strcmp(o[w - 1], o[i]) != 0) o[w++] = o[i];
    b->origins = o;
    b->norigins = w;
}

/* Merge sorted node-id sets. */
static void cover_add(Lower *L, Val *v, int n, const int *ids) {
    int *out = pool_alloc(L->pool, sizeof(int) * (size_t)(v->ncover + n + 1));
    int i = 0, j = 0, w = 0;
    while (i < v->ncover || j < n) {
        int a = i < v->ncover ? v->cover[i] : 1 << 30, c = j < n ? ids[j] : 1 << 30;
        int m = a < c ? a : c;
        if (a == m) i++;
        if (c == m) j++;
        out[w++] = m;
    }
    v->cover = out;
    v->ncover = w;
}

static void record(Lower *L, int node, int buf, const char *reason) {
    LoopProgram *p = L->p;
    p->dec = pool_grow(&p->pool, p->dec, &p->capdec, p->ndec + 1, sizeof(InlineDecision));
    InlineDecision *d = &p->dec[p->ndec++];
    d->node = node;
    d->buf = buf;
    d->users = L->uses[node];
    d->ops = L->val[node].fn ? ex_nops(L->val[node].fn) : 0;
    d->reason = pool_strdup(L->pool, reason);
    const Node *n = graph_node(L->g, node);
    if (buf >= 0)
        loop_log(L->cfg, LOG_INLINE, "inline: %%%d %s -> %s: %s\n", node, op_info[n->op].name,
                 p->bufs[buf]->name, reason);
    else
        loop_log(L->cfg, LOG_INLINE, "inline: %%%d %s inlined: %s\n", node, op_info[n->op].name,
                 reason);
}

/* Turn a value into a pointwise buffer of its own. */
static void materialize(Lower *L, int node, const char *reason) {
    const Node *n = graph_node(L->g, node);
    Buffer *b = new_buffer(L, node, BODY_POINTWISE);
    Index *map[KILN_MAX_RANK];
    b->np = squeeze(L, n->rank, n->shape, b->size, map);
    b->expr = ex_subst(L->pool, L->val[node].fn, map, b->np, b->size);
    set_cover(L, b, L->val[node].ncover, L->val[node].cover);
    b->reason = pool_strdup(L->pool, reason);
    record(L, node, b->id, reason);
    set_loaded(L, node, b);
}

/* Operand o's function seen from a consumer of rank R (numpy broadcasting:
 * dims align right, a size-1 operand dim reads index 0). */
static Expr *broadcast_fn(Lower *L, int o, int R, const int64_t *shape) {
    const Node *on = graph_node(L->g, o);
    Index *map[KILN_MAX_RANK];
    for (int j = 0; j < on->rank; j++) {
        int d = j + R - on->rank;
        map[j] = on->shape[j] == 1 ? ix_const(L->pool, 0) : ix_var(L->pool, d);
    }
    return ex_subst(L->pool, L->val[o].fn, map, R, shape);
}

/* ---- inlining policy: each rule says why a pointwise value must be
 * materialized, or returns false. The first rule that objects wins. ---------- */

typedef bool (*InlineRule)(Lower *L, int id, char *why, size_t n);

/* Outputs must exist in memory. */
static bool rule_output(Lower *L, int id, char *why, size_t n) {
    if (!L->nout[id]) return false;
    snprintf(why, n, "program output");
    return true;
}

/* A library kernel reads memory, not an expression. */
static bool rule_extern_operand(Lower *L, int id, char *why, size_t n) {
    if (!L->ext_read[id]) return false;
    snprintf(why, n, "read by an extern kernel");
    return true;
}

/* contiguous(x) asks for a copy: it is the one op that always materializes
 * (docs/design.md, "The graph IR"). */
static bool rule_contiguous(Lower *L, int id, char *why, size_t n) {
    if (graph_node(L->g, id)->op != OP_COPY) return false;
    snprintf(why, n, "contiguous() materializes");
    return true;
}

/* Recomputing in many consumers costs more than one write and N reads. */
static bool rule_many_users(Lower *L, int id, char *why, size_t n) {
    if (L->uses[id] <= L->cfg->max_inline_users) return false;
    snprintf(why, n, "%d users > max_inline_users %d", L->uses[id], L->cfg->max_inline_users);
    return true;
}

/* A large body bloats every consumer (and bounds inlined expression size). */
static bool rule_big_body(Lower *L, int id, char *why, size_t n) {
    int ops = ex_nops(L->val[id].fn);
    if (ops <= L->cfg->max_inline_ops) return false;
    snprintf(why, n, "%d ops > max_inline_ops %d", ops, L->cfg->max_inline_ops);
    return true;
}

/* Transcendentals are not worth recomputing: softmax's exp is read by the
 * sum and the div, and Inductor realizes it (4 nodes: amax, exp, sum, div).
 * A cheap chain read twice is recomputed instead (the "shared chain" wall). */
static bool rule_shared_expensive(Lower *L, int id, char *why, size_t n) {
    int op = ex_expensive(L->val[id].fn);
    if (L->uses[id] <= 1 || op < 0) return false;
    snprintf(why, n, "%d users and an expensive op (%s)", L->uses[id], op_info[op].name);
    return true;
}

static const InlineRule materialize_rules[] = {
    rule_output,     rule_extern_operand, rule_contiguous,
    rule_many_users, rule_big_body,       rule_shared_expensive,
};

static void decide_pointwise(Lower *L, int id) {
    char why[160];
    for (size_t i = 0; i < sizeof materialize_rules / sizeof *materialize_rules; i++)
        if (materialize_rules[i](L, id, why, sizeof why)) {
            materialize(L, id, why);
            return;
        }
    snprintf(why, sizeof why, "%d user%s, %d op%s, recomputed in each", L->uses[id],
             L->uses[id] == 1 ? "" : "s", ex_nops(L->val[id].fn),
             ex_nops(L->val[id].fn) == 1 ? "" : "s");
    record(L, id, -1, why);
}

/* ---- one node of each kind ----------------------------------------------------- */

static void lower_source(Lower *L, int id) {
    const Node *n = graph_node(L->g, id);
    if (n->op == OP_CONST) {
        L->val[id].fn = ex_const(L->pool, n->f[0]);
        return;
    }
    Buffer *b = new_buffer(L, id, n->op == OP_INPUT ? BODY_INPUT : BODY_WEIGHT);
    b->data = n->data;
    set_loaded(L, id, b);
}

static void lower_pointwise(Lower *L, int id) {
    const Node *n = graph_node(L->g, id);
    Expr *args[MAX_IN];
    Val *v = &L->val[id];
    for (int k = 0; k < n->nin; k++) {
        args[k] = broadcast_fn(L, n->in[k], n->rank, n->shape);
        cover_add(L, v, L->val[n->in[k]].ncover, L->val[n->in[k]].cover);
    }
    cover_add(L, v, 1, &id);
    v->fn = ex_op(L->pool, n->op, n->dtype, n->nin, args);
    decide_pointwise(L, id);
}

/* reshape: output coordinates -> flat index -> input coordinates. */
static void reshape_map(Lower *L, const Node *n, const Node *in, Index **map) {
    Index *v[KILN_MAX_RANK];
    vars(L, n->rank, v);
    Index *flat = ix_contiguous(L->pool, n->rank, n->shape, v);
    int64_t stride = 1;
    for (int j = in->rank - 1; j >= 0; j--) {
        map[j] = in->shape[j] == 1 ? ix_const(L->pool, 0)
                                   : ix_mod(L->pool, ix_div(L->pool, flat, stride), in->shape[j]);
        stride *= in->shape[j];
    }
}

/* map[j]: the index of input dim j in terms of the view's variables. */
static void view_map(Lower *L, const Node *n, const Node *in, Index **map) {
    Pool *P = L->pool;
    switch (n->op) {
    case OP_PERMUTE:
        for (int d = 0; d < n->rank; d++) map[n->attr[d]] = ix_var(P, d);
        return;
    case OP_EXPAND:
        for (int j = 0; j < in->rank; j++) {
            int d = j + n->rank - in->rank;
            map[j] = in->shape[j] == 1 ? ix_const(P, 0) : ix_var(P, d);
        }
        return;
    case OP_PAD: /* v - before; pad_fn adds the range tests */
        for (int j = 0; j < in->rank; j++)
            map[j] = ix_add(P, ix_var(P, j), ix_const(P, -n->attr[1 + j]));
        return;
    case OP_SLICE: /* start + step*v, step may be negative */
        for (int j = 0; j < in->rank; j++) map[j] = ix_var(P, j);
        map[n->attr[0]] =
            ix_add(P, ix_const(P, n->attr[1]), ix_mul(P, ix_var(P, (int)n->attr[0]), n->attr[3]));
        return;
    case OP_RESHAPE: reshape_map(L, n, in, map); return;
    default: lower_fail(L, "lower: %s is not a view", op_info[n->op].name);
    }
}

/* pad (constant): out(v) = x(v - before) where 0 <= v_d - before_d < x_d in
 * every padded dim, else the value: a select per padded dim around x's
 * function read at shifted indices. Edge and reflect pads were decomposed. */
static Expr *pad_fn(Lower *L, const Node *n, const Node *x, Expr *inner) {
    if (n->attr[0] != KILN_PAD_CONSTANT)
        lower_fail(L, "lower: pad mode %d was not decomposed", (int)n->attr[0]);
    Expr *e = inner, *value = ex_const(L->pool, n->f[0]);
    for (int d = n->rank - 1; d >= 0; d--) {
        Index *ix = ix_add(L->pool, ix_var(L->pool, d), ix_const(L->pool, -n->attr[1 + d]));
        e = ex_select(L->pool, ix, 0, x->shape[d], e, value, n->rank, n->shape);
    }
    return e;
}

/* concat along d: part k covers [o_k, o_k + n_k) of d and is read at v_d - o_k;
 * a chain of selects v_d < o_k + n_k ? part k : (the later parts). */
static Expr *concat_fn(Lower *L, int id) {
    const Node *n = graph_node(L->g, id);
    int d = (int)n->attr[0];
    int64_t off[MAX_IN], o = 0;
    for (int k = 0; k < n->nin; k++) {
        off[k] = o;
        o += graph_node(L->g, n->in[k])->shape[d];
    }
    Expr *e = NULL;
    for (int k = n->nin - 1; k >= 0; k--) {
        Index *map[KILN_MAX_RANK];
        vars(L, n->rank, map);
        map[d] = ix_add(L->pool, map[d], ix_const(L->pool, -off[k]));
        Expr *part = ex_subst(L->pool, L->val[n->in[k]].fn, map, n->rank, n->shape);
        int64_t end = off[k] + graph_node(L->g, n->in[k])->shape[d];
        e = !e ? part
               : ex_select(L->pool, ix_var(L->pool, d), EX_NOLO, end, part, e, n->rank, n->shape);
        cover_add(L, &L->val[id], L->val[n->in[k]].ncover, L->val[n->in[k]].cover);
    }
    return e;
}

static void lower_view(Lower *L, int id) {
    const Node *n = graph_node(L->g, id);
    int o = n->in[0];
    Index *map[KILN_MAX_RANK];
    Val *v = &L->val[id];
    if (n->op == OP_CONCAT) {
        v->fn = concat_fn(L, id);
        cover_add(L, v, 1, &id);
        if (L->nout[id]) materialize(L, id, "program output");
        return;
    }
    view_map(L, n, graph_node(L->g, o), map);
    v->fn = ex_subst(L->pool, L->val[o].fn, map, n->rank, n->shape);
    if (n->op == OP_PAD) v->fn = pad_fn(L, n, graph_node(L->g, o), v->fn);
    cover_add(L, v, L->val[o].ncover, L->val[o].cover);
    cover_add(L, v, 1, &id);
    if (L->nout[id]) materialize(L, id, "program output");
}

static ReduceOp reduce_op(Op op) {
    switch (op) {
    case OP_AMAX: return ROP_AMAX;
    case OP_AMIN: return ROP_AMIN;
    case OP_PROD: return ROP_PROD;
    default: return ROP_SUM;
    }
}

/* Variables: the kept (parallel) dims first, then the reduced dims. */
static void lower_reduction(Lower *L, int id) {
    const Node *n = graph_node(L->g, id), *x = graph_node(L->g, n->in[0]);
    bool red[KILN_MAX_RANK] = {false};
    for (int i = 0; i < n->nattr; i++) red[n->attr[i]] = true;
    Buffer *b = new_buffer(L, id, BODY_REDUCTION);
    int64_t ranges[KILN_MAX_RANK];
    for (int d = 0; d < x->rank; d++)
        if (x->shape[d] != 1 && !red[d]) b->size[b->np++] = x->shape[d];
    for (int d = 0; d < x->rank; d++)
        if (x->shape[d] != 1 && red[d]) b->rsize[b->nr++] = x->shape[d];
    memcpy(ranges, b->size, sizeof(int64_t) * (size_t)b->np);
    memcpy(ranges + b->np, b->rsize, sizeof(int64_t) * (size_t)b->nr);
    Index *map[KILN_MAX_RANK];
    int kp = 0, kr = b->np;
    for (int d = 0; d < x->rank; d++)
        map[d] = x->shape[d] == 1 ? ix_const(L->pool, 0) : ix_var(L->pool, red[d] ? kr++ : kp++);
    b->rop = reduce_op(n->op);
    b->expr = ex_subst(L->pool, L->val[n->in[0]].fn, map, b->np + b->nr, ranges);
    Val *v = &L->val[id];
    cover_add(L, v, L->val[n->in[0]].ncover, L->val[n->in[0]].cover);
    cover_add(L, v, 1, &id);
    set_cover(L, b, v->ncover, v->cover);
    b->reason = "reduction";
    record(L, id, b->id, "reduction");
    set_loaded(L, id, b);
}

/* An extern operand as a strided view; a value that is not one is copied. */
static BufView extern_operand(Lower *L, int o) {
    const Node *on = graph_node(L->g, o);
    BufView bv;
    memset(&bv, 0, sizeof bv);
    const Expr *fn = L->val[o].fn;
    if (fn->kind != EX_LOAD || !ix_affine(fn->index, on->rank, bv.stride, &bv.offset)) {
        materialize(L, o, "extern operand is not a strided view");
        fn = L->val[o].fn;
        ix_affine(fn->index, on->rank, bv.stride, &bv.offset);
    }
    bv.buf = fn->buf;
    bv.rank = on->rank;
    memcpy(bv.shape, on->shape, sizeof bv.shape);
    return bv;
}

static void lower_extern(Lower *L, int id) {
    const Node *n = graph_node(L->g, id);
    BufView ops[3];
    int k = 0;
    for (int j = 0; j < n->nin && k < 3; j++)
        if (n->in[j] >= 0) ops[k++] = extern_operand(L, n->in[j]);
    /* a call hands its sub-programs a pointer into its operand */
    if (n->op == OP_CALL && ops[0].stride[0] != 1 && ops[0].shape[0] > 1) {
        materialize(L, n->in[0], "a call's operand is dense");
        ops[0] = extern_operand(L, n->in[0]);
    }
    Buffer *b = new_buffer(L, id, BODY_EXTERN);
    b->ext_op = n->op;
    b->call = n->call;
    b->nopnds = k;
    memcpy(b->opnd, ops, sizeof ops);
    b->nattr = n->nattr;
    memcpy(b->attr, n->attr, sizeof b->attr);
    set_cover(L, b, 1, &id);
    b->reason = "extern kernel";
    record(L, id, b->id, "extern kernel");
    set_loaded(L, id, b);
}

static void lower_random(Lower *L, int id) {
    const Node *n = graph_node(L->g, id);
    Buffer *b = new_buffer(L, id, BODY_RAND);
    Index *map[KILN_MAX_RANK];
    b->np = squeeze(L, n->rank, n->shape, b->size, map);
    b->seed = n->seed;
    set_cover(L, b, 1, &id);
    b->reason = "random: materialized once, never recomputed";
    record(L, id, b->id, b->reason);
    set_loaded(L, id, b);
}

static void lower_node(Lower *L, int id) {
    const Node *n = graph_node(L->g, id);
    switch (op_info[n->op].kind) {
    case KIND_SOURCE: lower_source(L, id); break;
    case KIND_POINTWISE: lower_pointwise(L, id); break;
    case KIND_VIEW: lower_view(L, id); break;
    case KIND_REDUCTION: lower_reduction(L, id); break;
    case KIND_EXTERN: lower_extern(L, id); break;
    case KIND_RANDOM: lower_random(L, id); break;
    case KIND_COMPOSITE:
        lower_fail(L, "lower: composite op %s was not decomposed", op_info[n->op].name);
    }
    Val *v = &L->val[id];
    if (L->nout[id] && v->buf < 0) materialize(L, id, "program output");
    if (L->nout[id]) L->p->bufs[v->buf]->is_output = true;
}

/* ---- eager traffic ------------------------------------------------------------ */

/* Pad and concat are views here but copies in an eager framework. */
static bool eager_copy(Op op) { return op == OP_PAD || op == OP_CONCAT; }

/* Bytes an eager op reads for operand o: views are free, so a view reads at
 * most what it views (a broadcast operand counts its own numel); a literal
 * scalar is free. */
static int64_t operand_bytes(const Graph *g, int o) {
    int64_t e = node_numel(graph_node(g, o));
    while (op_info[graph_node(g, o)->op].kind == KIND_VIEW && !eager_copy(graph_node(g, o)->op)) {
        o = graph_node(g, o)->in[0];
        int64_t m = node_numel(graph_node(g, o));
        if (m < e) e = m;
    }
    if (graph_node(g, o)->op == OP_CONST) return 0;
    return e * loop_elsize(graph_node(g, o)->dtype);
}

int64_t lower_gathered_rows(int64_t axis_len, int64_t nidx) {
    return nidx < axis_len ? nidx : axis_len;
}

/* What a gather reads of its data: the rows its indices pick. */
static int64_t gathered_bytes(const Graph *g, const Node *n) {
    int64_t len = graph_node(g, n->in[0])->shape[n->attr[0]];
    if (len <= 0) return 0;
    int64_t rows = lower_gathered_rows(len, node_numel(graph_node(g, n->in[1])));
    return operand_bytes(g, n->in[0]) / len * rows;
}

/* Unfused: every (live) computing op reads its operands and writes its result;
 * pad and concat count as computing (eager frameworks copy them). */
static int64_t unfused_traffic(const Graph *g, const bool *live) {
    int64_t total = 0;
    for (int i = 0; i < g->n; i++) {
        const Node *n = graph_node(g, i);
        OpKind k = op_info[n->op].kind;
        if (!live[i] || k == KIND_SOURCE || (k == KIND_VIEW && !eager_copy(n->op))) continue;
        total += node_numel(n) * loop_elsize(n->dtype);
        for (int j = 0; k != KIND_RANDOM && j < n->nin; j++)
            if (n->in[j] >= 0)
                total += n->op == OP_GATHER && j == 0 ? gathered_bytes(g, n)
                                                      : operand_bytes(g, n->in[j]);
    }
    return total;
}

/* ---- entry ---------------------------------------------------------------------- */

static void lower_all(Lower *L) {
    const Graph *g = L->g;
    LoopProgram *p = L->p;
    Pool *P = L->pool;
    int n = g->n ? g->n : 1;
    L->val = pool_alloc(P, sizeof(Val) * (size_t)n);
    L->uses = pool_alloc(P, sizeof(int) * (size_t)n);
    L->ext_read = pool_alloc(P, sizeof(bool) * (size_t)n);
    L->nout = pool_alloc(P, sizeof(int) * (size_t)n);
    p->live = pool_alloc(P, sizeof(bool) * (size_t)n);
    p->node_buf = pool_alloc(P, sizeof(int) * (size_t)n);
    for (int i = 0; i < g->n; i++) L->val[i].buf = p->node_buf[i] = -1;
    analyze(L);
    for (int i = 0; i < g->n; i++)
        if (p->live[i]) lower_node(L, i);
    p->ninputs = g->ninputs;
    p->inputs = pool_alloc(P, sizeof(int) * (size_t)(g->ninputs + 1));
    for (int i = 0; i < g->ninputs; i++) p->inputs[i] = p->node_buf[g->inputs[i]];
    p->noutputs = g->noutputs;
    p->outputs = pool_alloc(P, sizeof(int) * (size_t)(g->noutputs + 1));
    p->outnames = pool_alloc(P, sizeof(char *) * (size_t)(g->noutputs + 1));
    for (int i = 0; i < g->noutputs; i++) {
        p->outputs[i] = L->val[g->outputs[i]].buf;
        p->outnames[i] = pool_strdup(P, g->outnames[i]);
    }
    p->unfused_bytes = unfused_traffic(g, p->live);
}

kiln_status lower_run(const Graph *g, const KilnConfig *cfg, LoopProgram **out, char *err,
                      size_t errlen) {
    *out = NULL;
    if (errlen) err[0] = 0;
    LoopProgram *p = kcalloc(1, sizeof *p);
    if (!p) {
        if (errlen) snprintf(err, errlen, "out of memory");
        return KILN_ERR_NOMEM;
    }
    KilnConfig def = kiln_config_default();
    Lower L = {
        .pool = &p->pool, .g = g, .cfg = cfg ? cfg : &def, .p = p, .err = err, .errlen = errlen};
    p->g = g;
    p->pool.oom = &L.jb;
    int r = setjmp(L.jb);
    if (r) {
        if (r == 1 && errlen) snprintf(err, errlen, "out of memory");
        lower_free(p);
        return r == 1 ? KILN_ERR_NOMEM : KILN_ERR_INPUT;
    }
    lower_all(&L);
    p->pool.oom = NULL;
    if (L.cfg->logs & LOG_LOOP_IR) lower_print(L.cfg->log ? L.cfg->log : stderr, p);
    *out = p;
    return KILN_OK;
}

void lower_free(LoopProgram *p) {
    if (!p) return;
    pool_free(&p->pool);
    kfree(p);
}

/* ---- printing the loop IR ---------------------------------------------------------- */

static void print_sizes(Str *s, int n, const int64_t *v) {
    str_putf(s, "[");
    for (int i = 0; i < n; i++) str_putf(s, "%s%lld", i ? ", " : "", (long long)v[i]);
    str_putf(s, "]");
}

const char *const rop_name[] = {"sum", "max", "min", "prod"};

static void print_view(Str *s, const LoopProgram *p, const BufView *v) {
    str_putf(s, "%s[shape ", p->bufs[v->buf]->name);
    print_sizes(s, v->rank, v->shape);
    str_putf(s, " strides ");
    print_sizes(s, v->rank, v->stride);
    str_putf(s, " offset %lld]", (long long)v->offset);
}

static void print_body(Str *s, const LoopProgram *p, const Buffer *b) {
    switch (b->body) {
    case BODY_INPUT:
    case BODY_WEIGHT:
        str_putf(s, "%s(%s", b->body == BODY_INPUT ? "Input" : "Weight", kiln_dtype_name(b->dtype));
        print_sizes(s, b->rank, b->shape);
        str_putf(s, ")");
        return;
    case BODY_POINTWISE:
        str_putf(s, "Pointwise(");
        print_sizes(s, b->np, b->size);
        str_putf(s, ", ");
        ex_print(s, p, b->expr);
        str_putf(s, ")");
        return;
    case BODY_REDUCTION:
        str_putf(s, "Reduction(");
        print_sizes(s, b->np, b->size);
        str_putf(s, ", ");
        print_sizes(s, b->nr, b->rsize);
        str_putf(s, ", %s, ", rop_name[b->rop]);
        ex_print(s, p, b->expr);
        str_putf(s, ")");
        return;
    case BODY_EXTERN:
        str_putf(s, "Extern(%s", op_info[b->ext_op].name);
        for (int i = 0; i < b->nopnds; i++) {
            str_putf(s, ", ");
            print_view(s, p, &b->opnd[i]);
        }
        str_putf(s, ")");
        return;
    case BODY_RAND:
        str_putf(s, "Rand(");
        print_sizes(s, b->np, b->size);
        str_putf(s, ", seed=%llu)", (unsigned long long)b->seed);
        return;
    }
}

void lower_print_buffer(FILE *f, const LoopProgram *p, const Buffer *b) {
    Pool tmp = {{0}, NULL};
    Str s;
    str_init(&s, &tmp);
    str_putf(&s, "%s: ", b->name);
    print_body(&s, p, b);
    if (buf_computed(b)) {
        str_putf(&s, " origins=[");
        for (int i = 0; i < b->norigins; i++) str_putf(&s, "%s%s", i ? ", " : "", b->origins[i]);
        str_putf(&s, "]");
    }
    if (b->is_output) str_putf(&s, " (output)");
    fprintf(f, "%s\n", str_get(&s));
    pool_free(&tmp);
}

void lower_print(FILE *f, const LoopProgram *p) {
    for (int i = 0; i < p->nbufs; i++) lower_print_buffer(f, p, p->bufs[i]);
}
