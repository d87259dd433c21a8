/*
 * emit.c -- a member's expression as C text. Every expression becomes
 * `float tmpN = ...;` temporaries, each placed at the depth of the deepest
 * loop variable it uses, so anything that depends only on the row (a loaded
 * row statistic, rsqrt(var + eps)) is computed once per row outside the
 * inner loop, and equal subexpressions are computed once (CSE on the
 * right-hand side text). Loads are plain array reads with affine indices
 * (print_index); math goes through ops.def's C forms (vecmath.h). A
 * division by a value the inner loop does not change (softmax's row sum)
 * is a multiply by its reciprocal, computed once outside the loop
 * (div_by_invariant), as PyTorch's softmax does. A member's value is kept
 * for its readers in the same kernel: in a temporary (same loop body), in a
 * per-row scalar (a reduction's result, a row step's value) or in a
 * per-thread row scratch array (an inner-loop value read by a later
 * stage); only STORE_GLOBAL members are written to memory. Reductions
 * carry `#pragma omp simd` reduction clauses; max/min keep a NaN flag so
 * that NaN propagates like torch.amax.
 */
#include "codegen/codegen.h"
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static Ent *table_find(Table *t, const char *key) {
    for (int i = t->n - 1; i >= 0; i--)
        if (!strcmp(t->e[i].key, key)) return &t->e[i];
    return NULL;
}

void cg_table_add(Pool *p, Table *t, const char *key, const char *c, int level, unsigned epoch) {
    t->e = pool_grow(p, t->e, &t->cap, t->n + 1, sizeof(Ent));
    t->e[t->n++] = (Ent){key, c, level, epoch};
}

/* Each line of text, indented by ind more spaces; blank lines stay blank. */
void cg_put_indented(Str *o, const char *text, int ind) {
    while (*text) {
        const char *nl = strchr(text, '\n');
        int len = nl ? (int)(nl - text) : (int)strlen(text);
        if (len)
            str_putf(o, "%*s%.*s\n", ind, "", len, text);
        else
            str_putf(o, "\n");
        text += len + (nl != NULL);
    }
}

/* A float literal that reads back as the same float. */
static const char *float_lit(Pool *p, double v) {
    float f = (float)v;
    if (isnan(f)) return "NAN";
    if (isinf(f)) return f > 0 ? "INFINITY" : "(-INFINITY)";
    char num[48];
    util_fmt(num, sizeof num, "%.9g", (double)f);
    if ((double)strtof(num, NULL) != (double)f) util_fmt(num, sizeof num, "%.17g", (double)f);
    bool plain = !strpbrk(num, ".en");
    return pool_printf(p, "%s%s%sf%s", f < 0 || signbit(f) ? "(" : "", num, plain ? ".0" : "",
                       f < 0 || signbit(f) ? ")" : "");
}

/* A double literal that reads back as the same double (f64 kernels). */
static const char *double_lit(Pool *p, double v) {
    if (isnan(v)) return "NAN";
    if (isinf(v)) return v > 0 ? "INFINITY" : "(-INFINITY)";
    char num[48];
    util_fmt(num, sizeof num, "%.17g", v);
    bool plain = !strpbrk(num, ".en");
    return pool_printf(p, "%s%s%s%s", v < 0 || signbit(v) ? "(" : "", num, plain ? ".0" : "",
                       v < 0 || signbit(v) ? ")" : "");
}

/* An f64 op's C form: libm's double functions and the prelude's _d
 * helpers (scalar code: libm's calls keep such a loop scalar, which f64
 * accepts). NULL for an op without one. */
static const char *f64_form(Op op) {
    switch (op) {
    case OP_ABS: return "fabs(%s)";
    case OP_RELU: return "kiln_relu_d(%s)";
    case OP_SIGMOID: return "kiln_sigmoid_d(%s)";
    case OP_TANH: return "tanh(%s)";
    case OP_EXP: return "exp(%s)";
    case OP_LOG: return "log(%s)";
    case OP_SQRT: return "sqrt(%s)";
    case OP_RSQRT: return "(1.0 / sqrt(%s))";
    case OP_SIN: return "sin(%s)";
    case OP_COS: return "cos(%s)";
    case OP_ERF: return "erf(%s)";
    case OP_GELU: return "kiln_gelu_d(%s)";
    case OP_FLOOR: return "floor(%s)";
    case OP_CEIL: return "ceil(%s)";
    case OP_RECIPROCAL: return "(1.0 / %s)";
    case OP_POW: return "pow(%s, %s)";
    case OP_FMOD: return "fmod(%s, %s)";
    case OP_MAXIMUM: return "kiln_max_d(%s, %s)";
    case OP_MINIMUM: return "kiln_min_d(%s, %s)";
    case OP_LT: return "kiln_lt_d(%s, %s)";
    case OP_LE: return "kiln_le_d(%s, %s)";
    case OP_GT: return "kiln_gt_d(%s, %s)";
    case OP_GE: return "kiln_ge_d(%s, %s)";
    case OP_EQ: return "kiln_eq_d(%s, %s)";
    case OP_NE: return "kiln_ne_d(%s, %s)";
    case OP_WHERE: return "kiln_where_d(%s, %s, %s)";
    case OP_NEG:
    case OP_COPY:
    case OP_ADD:
    case OP_SUB:
    case OP_MUL:
    case OP_DIV:
    case OP_TRUE_DIV: return op_info[op].cform;
    default: return NULL;
    }
}

/* "(a + b)" -> "a + b" when the outer parentheses enclose everything. */
static const char *strip_parens(Pool *p, const char *s) {
    size_t n = strlen(s);
    if (n < 2 || s[0] != '(' || s[n - 1] != ')') return s;
    int depth = 0;
    for (size_t i = 0; i < n; i++) {
        depth += (s[i] == '(') - (s[i] == ')');
        if (depth == 0 && i < n - 1) return s;
    }
    char *d = pool_alloc(p, n - 1);
    memcpy(d, s + 1, n - 2);
    return d;
}

/* A buffer name as a C identifier (inputs and weights keep the user's
 * name behind a prefix, so they never clash with generated locals). */
const char *cg_c_ident(Pool *p, const char *prefix, const char *name) {
    char *s = pool_printf(p, "%s%s", prefix, name);
    for (char *c = s + strlen(prefix); *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9')))
            *c = '_';
    return s;
}

static int clamp_level(const KGen *K, int level) {
    return level > 0 && level < K->collapse ? K->collapse : level;
}

static int dims_level(const KGen *K, uint32_t vars) {
    int level = 0;
    for (int d = 0; d < K->ndims; d++) {
        if (!((vars >> d) & 1u)) continue;
        int l = K->level_of[K->loop_of[d]];
        if (l < 0) cg_fail(K->g, "codegen: %s: dim %d used outside its loop", K->k->kernel, d);
        if (l > level) level = l;
    }
    return clamp_level(K, level);
}

void cg_line(KGen *K, int level, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof buf) { /* long lines (big expressions) go the slow way */
        char *big = pool_alloc(K->g->pool, (size_t)n + 1);
        va_start(ap, fmt);
        vsnprintf(big, (size_t)n + 1, fmt, ap);
        va_end(ap);
        str_putf(&K->block[level], "%s\n", big);
        return;
    }
    str_putf(&K->block[level], "%s\n", buf);
}

static bool valid(const KGen *K, const Ent *e) {
    return e->level <= K->inner && K->epoch[e->level] == e->epoch;
}

/* Bounds of an index over the dims' ranges (conservative). */
static void ix_bounds(const KGen *K, const Index *ix, int64_t *lo, int64_t *hi) {
    int64_t a, b;
    switch (ix->kind) {
    case IX_VAR:
        *lo = 0;
        *hi = K->size[ix->v] - 1;
        return;
    case IX_CONST: *lo = *hi = ix->v; return;
    case IX_ADD:
        *lo = *hi = 0;
        for (int i = 0; i < ix->n; i++) {
            ix_bounds(K, ix->a[i], &a, &b);
            *lo += a;
            *hi += b;
        }
        return;
    case IX_MUL:
        ix_bounds(K, ix->a[0], &a, &b);
        *lo = ix->v >= 0 ? a * ix->v : b * ix->v;
        *hi = ix->v >= 0 ? b * ix->v : a * ix->v;
        return;
    case IX_FLOORDIV:
        ix_bounds(K, ix->a[0], &a, &b);
        *lo = a >= 0 ? a / ix->v : -((-a + ix->v - 1) / ix->v);
        *hi = b >= 0 ? b / ix->v : -((-b + ix->v - 1) / ix->v);
        return;
    case IX_MOD:
        ix_bounds(K, ix->a[0], &a, &b);
        *lo = a >= 0 && b < ix->v ? a : 0;
        *hi = a >= 0 && b < ix->v ? b : ix->v - 1;
        return;
    }
}

static bool ix_nonneg(const KGen *K, const Index *ix) {
    int64_t lo, hi;
    ix_bounds(K, ix, &lo, &hi);
    return lo >= 0;
}

/* The C value of dim d. */
static const char *dim_text(const KGen *K, int d) {
    int L = K->loop_of[d];
    const char *n = K->loop[L].name;
    bool whole = K->div[d] * K->size[d] == K->loop[L].extent;
    if (K->div[d] == 1)
        return whole ? n : pool_printf(K->g->pool, "(%s %% %lld)", n, (long long)K->size[d]);
    if (whole) return pool_printf(K->g->pool, "(%s / %lld)", n, (long long)K->div[d]);
    return pool_printf(K->g->pool, "(%s / %lld %% %lld)", n, (long long)K->div[d],
                       (long long)K->size[d]);
}

/* Precedence: 0 anywhere, 1 operand of + (no parens needed), 2 operand of * / %. */
static void print_tree(const KGen *K, Str *o, const Index *ix, int prec) {
    switch (ix->kind) {
    case IX_VAR: str_putf(o, "%s", dim_text(K, (int)ix->v)); return;
    case IX_CONST: str_putf(o, ix->v < 0 ? "(%lld)" : "%lld", (long long)ix->v); return;
    case IX_ADD:
        if (prec >= 2) str_putf(o, "(");
        for (int i = 0; i < ix->n; i++) {
            if (i) str_putf(o, " + ");
            print_tree(K, o, ix->a[i], 1);
        }
        if (prec >= 2) str_putf(o, ")");
        return;
    case IX_MUL:
        str_putf(o, ix->v < 0 ? "(%lld)*" : "%lld*", (long long)ix->v);
        print_tree(K, o, ix->a[0], 2);
        return;
    case IX_FLOORDIV:
    case IX_MOD: {
        bool floordiv = ix->kind == IX_FLOORDIV;
        if (!ix_nonneg(K, ix->a[0])) {
            str_putf(o, "%s(", floordiv ? "kiln_floordiv" : "kiln_floormod");
            print_tree(K, o, ix->a[0], 0);
            str_putf(o, ", %lld)", (long long)ix->v);
            return;
        }
        str_putf(o, "(");
        print_tree(K, o, ix->a[0], 2);
        str_putf(o, " %s %lld)", floordiv ? "/" : "%", (long long)ix->v);
        return;
    }
    }
}

/* Per-loop coefficients of an affine index, when every loop's merged dims
 * appear in it the way the merge assumed (coef[d] = c_L * div[d]). */
bool cg_loop_coefs(const KGen *K, const int64_t *coef, int nvars, int64_t *lc) {
    bool seen[MAXL] = {false};
    for (int d = 0; d < nvars; d++)
        if (K->div[d] == 1) lc[K->loop_of[d]] = coef[d], seen[K->loop_of[d]] = true;
    for (int d = 0; d < nvars; d++) {
        int L = K->loop_of[d];
        if (!seen[L] || coef[d] != lc[L] * K->div[d]) return false;
    }
    for (int L = 0; L < K->nloops; L++)
        if (!seen[L]) lc[L] = 0;
    return true;
}

static void print_affine(const KGen *K, Str *o, const int64_t *lc, int64_t off) {
    bool first = true;
    for (int L = 0; L < K->nloops; L++) {
        if (!lc[L]) continue;
        int64_t c = lc[L];
        if (!first)
            str_putf(o, c < 0 ? " - " : " + ");
        else if (c < 0)
            str_putf(o, "-");
        if (c < 0) c = -c;
        if (c == 1)
            str_putf(o, "%s", K->loop[L].name);
        else
            str_putf(o, "%lld*%s", (long long)c, K->loop[L].name);
        first = false;
    }
    if (first)
        str_putf(o, "%lld", (long long)off);
    else if (off)
        str_putf(o, " %s %lld", off < 0 ? "-" : "+", (long long)(off < 0 ? -off : off));
}

/* An index over dims 0..nvars-1 as C text in the kernel's loop variables. */
IxText cg_print_index(const KGen *K, const Index *ix, int nvars) {
    Str o;
    str_init(&o, K->g->pool);
    int64_t coef[MAXL], off, lc[MAXL];
    IxText t = {NULL, dims_level(K, ix_vars(ix)), true, false};
    int innermost = K->innermost;
    if (ix_affine(ix, nvars, coef, &off) && cg_loop_coefs(K, coef, nvars, lc)) {
        print_affine(K, &o, lc, off);
        if (innermost >= 0) {
            t.unit = lc[innermost] == 0 || lc[innermost] == 1;
            t.near = lc[innermost] >= 2 && lc[innermost] <= 4;
        }
    } else {
        print_tree(K, &o, ix, 0);
        t.unit = t.level < K->inner;
    }
    t.c = str_get(&o);
    return t;
}

/* A temporary holding rhs at a level (a double when f64), or the equal one
 * already there. */
static Val temp_typed(KGen *K, int level, const char *rhs, bool f64) {
    Pool *P = K->g->pool;
    rhs = strip_parens(P, rhs);
    const char *key = f64 ? pool_printf(P, "double %s", rhs) : rhs;
    Ent *e = table_find(&K->cse, key);
    if (e && valid(K, e)) return (Val){e->c, e->level};
    const char *name = pool_printf(P, "tmp%d", K->ntmp++);
    cg_line(K, level, "%s %s = %s;", f64 ? "double" : "float", name, rhs);
    cg_table_add(P, &K->cse, key, name, level, K->epoch[level]);
    return (Val){name, level};
}

static Val temp(KGen *K, int level, const char *rhs) { return temp_typed(K, level, rhs, false); }

const char *cg_reg_key(Pool *p, int buf, const char *ix) {
    return pool_printf(p, "%d:%s", buf, ix);
}

void cg_note_access(KGen *K, int buf, IxText ix, uint8_t how) {
    K->use[buf] |= how;
    if (ix.level == K->inner && !ix.unit) K->strided = true;
    if (ix.level == K->inner && !ix.unit && !ix.near) K->far = true;
}

static Val emit_load(KGen *K, const Expr *e, int nvars) {
    Pool *P = K->g->pool;
    IxText ix = cg_print_index(K, e->index, nvars);
    const char *key = cg_reg_key(P, e->buf, ix.c);
    Ent *r = table_find(&K->regs, key);
    if (r && valid(K, r)) return (Val){r->c, r->level};
    const Buffer *b = buf_of(K->g, e->buf);
    Ent *row = table_find(&K->rows, key);
    if (row) return temp_typed(K, ix.level, row->c, b->dtype == KILN_F64);
    if (buf_computed(b) && K->g->s->node_of_buf[e->buf] >= 0) {
        /* a member of this kernel that is not in memory: a scheduler bug */
        for (int i = 0; i < K->k->n; i++)
            if (snode(K->g, K->k->members[i])->buf == e->buf && K->k->store[i] != STORE_GLOBAL)
                cg_fail(K->g, "codegen: %s reads %s[%s], which lives in registers only",
                        K->k->kernel, K->g->bufname[e->buf], ix.c);
    }
    cg_note_access(K, e->buf, ix, USE_READ);
    bool f64 = b->dtype == KILN_F64; /* the prefetch helpers take floats */
    if (K->pf.record && !K->guard && !f64) cg_note_row_load(K, e->buf, ix);
    if (K->st.prefetch && !K->guard && !f64) cg_note_stream_load(K, e->buf, ix);
    K->guarded |= K->guard != NULL;
    if (K->guard) /* a select's branch may address outside the buffer */
        return temp_typed(
            K, ix.level > K->guard_level ? ix.level : K->guard_level,
            pool_printf(P, "%s ? %s[%s] : 0.0f", K->guard, K->g->bufname[e->buf], ix.c), f64);
    return temp_typed(K, ix.level, pool_printf(P, "%s[%s]", K->g->bufname[e->buf], ix.c), f64);
}

/* A C form with each %s replaced by the next operand. */
static const char *apply_form(Pool *p, const char *form, const Val *args, int nargs) {
    Str o;
    str_init(&o, p);
    int k = 0;
    for (const char *c = form; *c; c++) {
        if (c[0] == '%' && c[1] == 's' && k < nargs) {
            str_putf(&o, "%s", args[k++].c);
            c++;
        } else {
            str_putf(&o, "%c", *c);
        }
    }
    return str_get(&o);
}

/* pow with a constant exponent avoids libm's scalar powf where it can. */
static const char *pow_form(const Expr *e) {
    const Expr *y = e->args[1];
    if (y->kind != EX_CONST) return "powf(%s, %s)";
    float f = (float)y->value;
    if (f == floorf(f) && fabsf(f) <= CG_POWI_MAX) return NULL; /* kiln_powi */
    if (f == 0.5f) return "kiln_pow_half(%s)";
    if (f == -0.5f) return "(1.0f / kiln_pow_half(%s))";
    return "powf(%s, %s)";
}

/* a / d with d invariant in a's (deeper) loop, such as softmax's division
 * by its row sum: a * (1 / d), one divide per outer iteration instead of a
 * vector divide per element, as PyTorch's softmax does (docs/decisions.md:
 * Division by a row value as a reciprocal multiply). 1.5 ulp instead
 * of 0.5. So that 1 / d cannot overflow for a tiny d (below 2^-128) while
 * a / d is finite, a divisor under 2^-100 is scaled by 2^100 first, and a
 * with it: both exactly, being powers of 2 (kiln_rcp_scale). Zero,
 * infinite and NaN divisors give what the division gives. */
static const char *div_by_invariant(KGen *K, Val a, Val d) {
    Pool *P = K->g->pool;
    Val sc = temp(K, d.level, pool_printf(P, "kiln_rcp_scale(%s)", d.c));
    Val rc = temp(K, d.level, pool_printf(P, "1.0f / (%s * %s)", d.c, sc.c));
    return pool_printf(P, "%s * %s * %s", a.c, sc.c, rc.c);
}

static Val emit_op(KGen *K, const Expr *e, int nvars) {
    Val args[MAX_IN];
    int level = 0;
    if (e->nargs > MAX_IN) cg_fail(K->g, "codegen: %d operands", e->nargs);
    for (int i = 0; i < e->nargs; i++) {
        args[i] = cg_emit_expr(K, e->args[i], nvars);
        if (args[i].level > level) level = args[i].level;
    }
    const char *form = op_info[e->op].cform, *rhs;
    bool f64 = ex_op_f64(e);
    if (e->op == OP_CAST) {
        rhs = pool_printf(K->g->pool, "(%s)%s", f64 ? "double" : "float", args[0].c);
        return temp_typed(K, level, rhs, f64);
    }
    if (f64) {
        if (!(form = f64_form(e->op)))
            cg_fail(K->g, "codegen: %s has no f64 form", op_info[e->op].name);
        return temp_typed(K, level, apply_form(K->g->pool, form, args, e->nargs),
                          e->dtype == KILN_F64);
    }
    if (!form || !*form) cg_fail(K->g, "codegen: %s is not a pointwise op", op_info[e->op].name);
    if (e->op == OP_DIV && e->args[1]->kind != EX_CONST && args[1].level < args[0].level)
        return temp(K, level, div_by_invariant(K, args[0], args[1]));
    if (e->op == OP_POW && !(form = pow_form(e)))
        rhs =
            pool_printf(K->g->pool, "kiln_powi(%s, %d)", args[0].c, (int)(float)e->args[1]->value);
    else
        rhs = apply_form(K->g->pool, form, args, e->nargs);
    return temp(K, level, rhs);
}

/* A select's condition as an int temporary at the depth of its index, so a
 * test of an outer loop's variable is computed once per outer iteration and
 * the inner loop sees a loop-invariant mask (GCC then vectorizes the masked
 * loads of a 3-D pool's window). */
static const char *cond_temp(KGen *K, int level, const char *cond) {
    Pool *P = K->g->pool;
    const char *key = pool_printf(P, "int %s", cond);
    Ent *e = table_find(&K->cse, key);
    if (e && valid(K, e)) return e->c;
    const char *name = pool_printf(P, "c%d", K->ntmp++);
    cg_line(K, level, "int %s = %s;", name, cond);
    cg_table_add(P, &K->cse, key, name, level, K->epoch[level]);
    return name;
}

static void count_load(const Expr *e, void *ud) {
    (void)e;
    ++*(int *)ud;
}

/* One branch of a select, its loads guarded by the conditions that choose it
 * (pad and concat read x at v - before, out of bounds in the border; the
 * guarded load `c ? x[i] : 0.0f` becomes a masked vector load). A nest with
 * a guarded load gets `omp simd` on its innermost loop even when that loop
 * is strided (K->guarded): left to choose, GCC 12 vectorized an outer loop
 * of such a nest wrongly (fuzz-diff seed 1795995102551586: max_pool3d then
 * avg_pool3d, both padded; -O3 wrong, -O1 right; reduced in
 * tests/test_fused.c, fused_guarded_outer_loop). */
Val cg_emit_branch(KGen *K, const Expr *e, int nvars, const char *cond, int level) {
    const char *saved = K->guard;
    int saved_level = K->guard_level;
    int nloads = 0;
    ex_loads(e, count_load, &nloads);
    K->guard_level = saved_level > level ? saved_level : level;
    if (nloads) /* a branch without loads (a pad's value) needs no guard */
        K->guard =
            saved ? cond_temp(K, K->guard_level, pool_printf(K->g->pool, "%s && %s", saved, cond))
                  : cond;
    Val v = cg_emit_expr(K, e, nvars);
    K->guard = saved;
    K->guard_level = saved_level;
    return v;
}

static Val emit_select(KGen *K, const Expr *e, int nvars) {
    Pool *P = K->g->pool;
    IxText ix = cg_print_index(K, e->index, nvars);
    const char *lo = e->lo == EX_NOLO ? "" : pool_printf(P, "%s >= %lld", ix.c, (long long)e->lo);
    const char *hi = e->hi == EX_NOHI ? "" : pool_printf(P, "%s < %lld", ix.c, (long long)e->hi);
    const char *cond =
        cond_temp(K, ix.level, pool_printf(P, "%s%s%s", lo, *lo && *hi ? " && " : "", hi));
    Val a = cg_emit_branch(K, e->args[0], nvars, cond, ix.level);
    Val b = cg_emit_branch(K, e->args[1], nvars, pool_printf(P, "!%s", cond), ix.level);
    int level = ix.level > a.level ? ix.level : a.level;
    if (b.level > level) level = b.level;
    /* kiln_vm_sel, not ?:, for the reason vecmath.h gives (GCC threads jumps
     * through a ?: with a constant arm and the loop stays scalar) */
    bool f64 = e->dtype == KILN_F64;
    return temp_typed(K, level,
                      pool_printf(P, "kiln_vm_sel%s(%s, %s, %s)", f64 ? "64" : "", cond, a.c, b.c),
                      f64);
}

Val cg_emit_expr(KGen *K, const Expr *e, int nvars) {
    switch (e->kind) {
    case EX_SELECT: return emit_select(K, e, nvars);
    case EX_CONST:
        return (Val){e->dtype == KILN_F64 ? double_lit(K->g->pool, e->value)
                                          : float_lit(K->g->pool, e->value),
                     0};
    case EX_LOAD: return emit_load(K, e, nvars);
    case EX_OP: return emit_op(K, e, nvars);
    }
    cg_fail(K->g, "codegen: bad expression kind %d", (int)e->kind);
}

/* The store index of a member: contiguous over its own loop sizes. */
const Index *cg_store_index(KGen *K, int nvars, const int64_t *sizes) {
    Pool *P = K->g->pool;
    Index *v[MAXL];
    for (int d = 0; d < nvars; d++) v[d] = ix_var(P, d);
    return ix_simplify(P, ix_contiguous(P, nvars, sizes, v), nvars, sizes);
}

int cg_member_vars(const SNode *n) { return n->body == BODY_REDUCTION ? n->np + n->nr : n->np; }

/* A value to keep for later stages of this row: a scalar when it is the same
 * for the whole row, else a per-thread row of scratch. */
/* A per-thread float array of n elements for the kernel (scratch_decls). */
void cg_add_scratch(KGen *K, const char *name, int64_t n) {
    cg_add_scratch_typed(K, name, n, false);
}

void cg_add_scratch_typed(KGen *K, const char *name, int64_t n, bool f64) {
    K->scratch =
        pool_grow(K->g->pool, K->scratch, &K->capscratch, K->nscratch + 1, sizeof(Scratch));
    K->scratch[K->nscratch++] = (Scratch){name, n, f64};
}

static void keep_row_local(KGen *K, const Buffer *b, const char *key, Val v, int nvars,
                           const int64_t *sizes) {
    int buf = b->id;
    Pool *P = K->g->pool;
    if (v.level <= K->npl) {
        cg_table_add(P, &K->regs, key, v.c, v.level, K->epoch[v.level]);
        return;
    }
    const Index *six = cg_store_index(K, nvars, sizes);
    int64_t rn = K->k->rnumel;
    const Index *rix = ix_simplify(P, ix_mod(P, (Index *)six, rn), nvars, sizes);
    IxText r = cg_print_index(K, rix, nvars);
    const char *arr = pool_printf(P, "row_%s%s", K->g->bufname[buf], K->rp.sfx);
    cg_add_scratch_typed(K, arr, rn, b->dtype == KILN_F64);
    const char *slot = pool_printf(P, "%s[%s]", arr, r.c);
    cg_line(K, r.level > v.level ? r.level : v.level, "%s = %s;", slot, v.c);
    cg_table_add(P, &K->rows, key, slot, r.level, 0);
}

static void gen_pointwise_member(KGen *K, int i) {
    const SNode *n = snode(K->g, K->k->members[i]);
    const Buffer *b = member_buf(K, i);
    Pool *P = K->g->pool;
    Val v;
    const Index *six = cg_store_index(K, n->np, n->P);
    IxText ix = cg_print_index(K, six, n->np);
    if (b->body == BODY_RAND)
        v = temp(K, ix.level,
                 pool_printf(P, "kiln_rand(%lluull, (uint64_t)(%s))", (unsigned long long)b->seed,
                             ix.c));
    else
        v = cg_emit_expr(K, b->expr, n->np);
    const char *key = cg_reg_key(P, b->id, ix.c);
    if (K->k->store[i] == STORE_GLOBAL) {
        cg_note_access(K, b->id, ix, USE_WRITE);
        if (!cg_stream_store(K, b, ix, v))
            cg_line(K, ix.level > v.level ? ix.level : v.level, "%s[%s] = %s;",
                    K->g->bufname[b->id], ix.c, v.c);
    }
    if (K->k->store[i] == STORE_ROW_LOCAL) keep_row_local(K, b, key, v, n->np, n->P);
    cg_table_add(P, &K->regs, key, v.c, v.level, K->epoch[v.level]);
}

const char *cg_rop_identity(ReduceOp op) {
    switch (op) {
    case ROP_SUM: return "0.0f";
    case ROP_PROD: return "1.0f";
    case ROP_AMAX: return "-INFINITY";
    case ROP_AMIN: return "INFINITY";
    }
    return "0.0f";
}

/* acc = acc op v, inside the stage's innermost loop, with the clause that
 * lets the loop run in SIMD lanes. Sums and products accumulate in float
 * (CgOptions.double_acc: in double, like the interpreter, which is slower
 * out of cache: the widening conversions fill the reorder window and fewer
 * loads are in flight; docs/decisions.md: Sums accumulate in float); max
 * and min are exact and raise a NaN flag, because OpenMP combines the lanes
 * with a max that may drop a NaN; with the flag, the max in the loop may
 * drop it too (kiln_red_max: one vmaxps, not kiln_max's compare, vmaxps
 * and blend). After the loop the row's value is a float. */
static void gen_reduction_member(KGen *K, int i) {
    if (K->outer.xin >= 0) {
        cg_gen_outer_reduction_member(K, i);
        return;
    }
    const SNode *n = snode(K->g, K->k->members[i]);
    const Buffer *b = member_buf(K, i);
    Pool *P = K->g->pool;
    const char *nm = K->g->bufname[b->id];
    const char *acc = pool_printf(P, "acc_%s%s", nm, K->rp.sfx),
               *nan = pool_printf(P, "nan_%s%s", nm, K->rp.sfx);
    bool minmax = b->rop == ROP_AMAX || b->rop == ROP_AMIN, f64 = b->dtype == KILN_F64;
    /* an f64 reduction accumulates in double and stores its double */
    bool narrow = !f64 && (minmax || !K->g->double_acc);
    const char *val = narrow || f64 ? acc : pool_printf(P, "red_%s%s", nm, K->rp.sfx);
    const char *wide = K->g->double_acc && !f64 ? "(double)" : "";
    const char *type = narrow ? "float" : "double";
    const char *ident = narrow || minmax    ? cg_rop_identity(b->rop)
                        : b->rop == ROP_SUM ? "0.0"
                                            : "1.0";
    const char *d = f64 ? "_d" : "";
    cg_line(K, K->npl, "%s %s = %s;", type, acc, ident);
    if (minmax) cg_line(K, K->npl, "int %s = 0;", nan);
    /* in lanes (see spread_stage): acc and nan stand for their lane's
     * element inside the loop, and the lanes combine after it */
    const char *el = acc, *nel = nan;
    if (K->lane.index) {
        el = pool_printf(P, "lane_%s[%s]", acc, K->lane.index);
        nel = pool_printf(P, "lane_%s[%s]", nan, K->lane.index);
        cg_line(K, K->npl, "%s lane_%s[%d];", type, acc, CG_LANES);
        if (minmax) {
            cg_line(K, K->npl, "int lane_%s[%d];", nan, CG_LANES);
            cg_line(K, K->npl, "for (int l = 0; l < %d; l++) { lane_%s[l] = %s; lane_%s[l] = 0; }",
                    CG_LANES, acc, ident, nan);
        } else {
            cg_line(K, K->npl, "for (int l = 0; l < %d; l++) lane_%s[l] = %s;", CG_LANES, acc,
                    ident);
        }
    }
    Val v = cg_emit_expr(K, b->expr, n->np + n->nr);
    switch (b->rop) {
    case ROP_SUM: cg_line(K, K->inner, "%s += %s%s;", el, wide, v.c); break;
    case ROP_PROD: cg_line(K, K->inner, "%s *= %s%s;", el, wide, v.c); break;
    case ROP_AMAX:
    case ROP_AMIN:
        cg_line(K, K->inner, "%s = kiln_red_%s%s(%s, %s);", el, b->rop == ROP_AMAX ? "max" : "min",
                d, el, v.c);
        cg_line(K, K->inner, "%s |= %s != %s;", nel, v.c, v.c);
        break;
    }
    static const char *const clause[] = {"+", "max", "min", "*"};
    if (K->lane.index) {
        static const char *const combine[] = {
            "%s += lane_%s[l];", "%s = kiln_red_max(%s, lane_%s[l]);",
            "%s = kiln_red_min(%s, lane_%s[l]);", "%s *= lane_%s[l];"};
        if (f64) cg_fail(K->g, "codegen: %s: an f64 reduction in lanes", K->k->kernel);
        Str c;
        str_init(&c, P);
        if (minmax)
            str_putf(&c, combine[b->rop], acc, acc, acc);
        else
            str_putf(&c, combine[b->rop], acc, acc);
        if (minmax)
            str_putf(&K->post, "for (int l = 0; l < %d; l++) { %s %s |= lane_%s[l]; }\n", CG_LANES,
                     str_get(&c), nan, nan);
        else
            str_putf(&K->post, "for (int l = 0; l < %d; l++) %s\n", CG_LANES, str_get(&c));
    } else {
        str_putf(&K->clauses, " reduction(%s:%s)", clause[b->rop], acc);
        if (minmax) str_putf(&K->clauses, " reduction(|:%s)", nan);
    }
    if (minmax)
        str_putf(&K->post, "if (%s) %s = NAN;\n", nan, acc);
    else if (K->g->double_acc && !f64)
        str_putf(&K->post, "float %s = (float)%s;\n", val, acc);
    IxText ix = cg_print_index(K, cg_store_index(K, n->np, n->P), n->np);
    if (K->k->store[i] == STORE_GLOBAL) {
        cg_note_access(K, b->id, ix, USE_WRITE);
        str_putf(&K->post, "%s[%s] = %s;\n", nm, ix.c, val);
    }
    cg_table_add(P, &K->regs, cg_reg_key(P, b->id, ix.c), val, K->npl, K->epoch[K->npl]);
    K->has_red = true;
}

void cg_gen_member(KGen *K, int i) {
    if (member_buf(K, i)->body == BODY_REDUCTION)
        gen_reduction_member(K, i);
    else
        gen_pointwise_member(K, i);
}
