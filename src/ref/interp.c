/*
 * interp.c -- the reference interpreter: every op by itself, every value
 * materialized, plain loops.
 *
 * This is kiln's correctness oracle (fused results are checked against it)
 * and its "unfused eager" baseline, so it favours obviously-right code over
 * speed, but it is not gratuitously slow: all strided work goes through one
 * loop-nest walker (Nest) that drops size-1 dims, merges dims that are
 * contiguous for every array it walks, and hands whole inner rows to a
 * kernel whose switch over the op sits outside the element loop.
 *
 * Every node becomes a contiguous C-ordered double array (bools as 0 and
 * 1), whatever its dtype: an f32 node's elements are floats held in
 * doubles, an f64 node's are doubles. Views are gathers through strides (a
 * broadcast dim has stride 0), never arithmetic. Numerics of an f32 node:
 * its operands are read as floats (a scalar constant is rounded to float
 * there), +, -, *, / and comparisons are done in float, which is exact
 * rounding already; transcendentals (exp, log, tanh, sin, cos, erf, pow,
 * sigmoid, rsqrt) are evaluated in double and rounded once, so the oracle
 * is at least as accurate as the generated code's float libm calls. An
 * f64 node computes in double with libm's double functions. Sums,
 * products, matmul and conv accumulate in double. max/min/relu propagate
 * NaN the way torch does.
 *
 * Memory: a value is freed as soon as its last user has run (graph_use_counts);
 * inputs and weights are borrowed, never freed. Any allocation failure is
 * reported as KILN_ERR_NOMEM in the graph and everything is released.
 *
 * Contract: requires a decomposed graph (no KIND_COMPOSITE nodes) whose node
 * ids are in topological order; never prints, never exits.
 */
#include "ref/ref.h"
#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* ===== the loop-nest walker ============================================ */

#define NARR (MAX_IN + 1) /* most arrays one nest walks: output + operands */

/* A loop nest over `rank` dims walking `narr` arrays, each with its own
 * strides (in elements; 0 broadcasts) and base offset. */
typedef struct {
    int rank;
    int64_t size[KILN_MAX_RANK];
    int narr;
    int64_t base[NARR];
    int64_t stride[NARR][KILN_MAX_RANK];
} Nest;

/* Called once per inner row: off[a] is array a's offset of the row's first
 * element, step[a] its stride along the row, n the row length. */
typedef void (*RowFn)(void *ctx, const int64_t *off, int64_t n, const int64_t *step);

static void contiguous_strides(int rank, const int64_t *shape, int64_t elem, int64_t *stride) {
    int64_t s = elem;
    for (int d = rank - 1; d >= 0; d--) {
        stride[d] = s;
        s *= shape[d];
    }
}

/* Strides that read an array of shape in_shape (contiguous, each element
 * `elem` apart) as out_shape under numpy broadcasting: dims are
 * right-aligned, and missing or size-1 dims get stride 0. */
static void bcast_strides(int in_rank, const int64_t *in_shape, int64_t elem, int out_rank,
                          const int64_t *out_shape, int64_t *stride) {
    int64_t own[KILN_MAX_RANK];
    assert(in_rank <= out_rank);
    contiguous_strides(in_rank, in_shape, elem, own);
    for (int d = 0; d < out_rank; d++) {
        int k = d - (out_rank - in_rank);
        bool real = k >= 0 && !(in_shape[k] == 1 && out_shape[d] != 1);
        stride[d] = real ? own[k] : 0;
    }
}

static void nest_init(Nest *s, int rank, const int64_t *size, int narr) {
    memset(s, 0, sizeof *s);
    s->rank = rank;
    s->narr = narr;
    for (int d = 0; d < rank; d++) s->size[d] = size[d];
}

/* Can dim d be folded into dim d+1 for every array? */
static bool mergeable(const Nest *s, int d) {
    for (int a = 0; a < s->narr; a++)
        if (s->stride[a][d] != s->stride[a][d + 1] * s->size[d + 1]) return false;
    return true;
}

static void drop_dim(Nest *s, int d) {
    for (int e = d; e + 1 < s->rank; e++) {
        s->size[e] = s->size[e + 1];
        for (int a = 0; a < s->narr; a++) s->stride[a][e] = s->stride[a][e + 1];
    }
    s->rank--;
}

/* Drop size-1 dims and merge contiguous ones; leaves rank >= 1. The walk
 * order (C order of the nest's dims) is unchanged. */
static void nest_coalesce(Nest *s) {
    for (int d = s->rank - 1; d >= 0; d--)
        if (s->size[d] == 1 && s->rank > 1) drop_dim(s, d);
    for (int d = s->rank - 2; d >= 0; d--)
        if (mergeable(s, d)) {
            for (int a = 0; a < s->narr; a++) s->stride[a][d] = s->stride[a][d + 1];
            s->size[d] *= s->size[d + 1];
            drop_dim(s, d + 1);
        }
    if (s->rank == 0) { /* a rank-0 nest is one row of one element */
        s->rank = 1;
        s->size[0] = 1;
        for (int a = 0; a < s->narr; a++) s->stride[a][0] = 0;
    }
}

/* Walk every row of the nest in C order. */
static void nest_run(Nest *s, RowFn fn, void *ctx) {
    int64_t idx[KILN_MAX_RANK] = {0}, off[NARR], step[NARR];
    nest_coalesce(s);
    for (int d = 0; d < s->rank; d++)
        if (s->size[d] == 0) return;
    int inner = s->rank - 1;
    for (int a = 0; a < s->narr; a++) {
        off[a] = s->base[a];
        step[a] = s->stride[a][inner];
    }
    for (;;) {
        fn(ctx, off, s->size[inner], step);
        int d = inner - 1;
        for (; d >= 0; d--) {
            for (int a = 0; a < s->narr; a++) off[a] += s->stride[a][d];
            if (++idx[d] < s->size[d]) break;
            for (int a = 0; a < s->narr; a++) off[a] -= s->stride[a][d] * s->size[d];
            idx[d] = 0;
        }
        if (d < 0) return;
    }
}

/* ===== interpreter state ================================================ */

typedef struct {
    double *data; /* the node's materialized value; NULL before/after its life */
    bool owned;   /* allocated here (f64 inputs and weights are borrowed) */
} Val;

typedef struct {
    Graph *g;
    Val *val;         /* one per node */
    int *uses;        /* users not yet run, outputs counted as users */
    uint64_t perturb; /* 0, or the seed of kiln_interpret_perturbed's nudges */
} Interp;

static const char *op_name(Op op) { return op_info[op].name; }

static kiln_status nomem(Interp *it, int id, size_t bytes) {
    graph_fail(it->g, KILN_ERR_NOMEM, "out of memory: %lld bytes for %s (node %d)",
               (long long)bytes, op_name(it->g->nodes[id].op), id);
    return KILN_ERR_NOMEM;
}

/* n elements of `size` bytes for node id (at least one element, so that an
 * empty tensor still has a buffer); NULL after reporting NOMEM. */
static void *scratch(Interp *it, int id, int64_t n, size_t size) {
    if (n < 1) n = 1;
    if ((uint64_t)n > SIZE_MAX / size) {
        nomem(it, id, SIZE_MAX);
        return NULL;
    }
    void *p = kmalloc((size_t)n * size);
    if (!p) nomem(it, id, (size_t)n * size);
    return p;
}

static const Node *node(const Interp *it, int id) { return graph_node(it->g, id); }
static const double *operand(const Interp *it, const Node *n, int k) {
    return it->val[n->in[k]].data;
}

/* ===== pointwise ========================================================= */

typedef struct {
    Op op;
    bool f64;   /* computes in double (an f64 result or operand) */
    bool round; /* where's result is f32: its operands round to float */
    double *out;
    const double *in[3];
} PwCtx;

static float relu_f(float x) { return x < 0.0f ? 0.0f : x; }               /* NaN stays */
static float max_f(float a, float b) { return (a != a || a > b) ? a : b; } /* NaN wins */
static float min_f(float a, float b) { return (a != a || a < b) ? a : b; }
static float sigmoid_f(float x) { return (float)(1.0 / (1.0 + exp(-(double)x))); }
#define DBL(f, x) ((float)f((double)(x)))

#define MAP1(E)                       \
    for (int64_t j = 0; j < n; j++) { \
        float x = (float)a[j * sa];   \
        o[j * so] = (E);              \
    }                                 \
    break
#define MAP2(E)                                           \
    for (int64_t j = 0; j < n; j++) {                     \
        float x = (float)a[j * sa], y = (float)b[j * sb]; \
        o[j * so] = (E);                                  \
    }                                                     \
    break
#define MAPD1(E)                      \
    for (int64_t j = 0; j < n; j++) { \
        double x = a[j * sa];         \
        o[j * so] = (E);              \
    }                                 \
    break
#define MAPD2(E)                             \
    for (int64_t j = 0; j < n; j++) {        \
        double x = a[j * sa], y = b[j * sb]; \
        o[j * so] = (E);                     \
    }                                        \
    break

static double relu_d(double x) { return x < 0.0 ? 0.0 : x; }
static double max_d(double a, double b) { return (a != a || a > b) ? a : b; }
static double min_d(double a, double b) { return (a != a || a < b) ? a : b; }

/* An f64 node: libm's double functions. */
static void pw_unary_d(Op op, double *o, int64_t so, const double *a, int64_t sa, int64_t n) {
    switch (op) {
    case OP_NEG: MAPD1(-x);
    case OP_ABS: MAPD1(fabs(x));
    case OP_RELU: MAPD1(relu_d(x));
    case OP_SIGMOID: MAPD1(1.0 / (1.0 + exp(-x)));
    case OP_TANH: MAPD1(tanh(x));
    case OP_EXP: MAPD1(exp(x));
    case OP_LOG: MAPD1(log(x));
    case OP_SQRT: MAPD1(sqrt(x));
    case OP_RSQRT: MAPD1(1.0 / sqrt(x));
    case OP_SIN: MAPD1(sin(x));
    case OP_COS: MAPD1(cos(x));
    case OP_ERF: MAPD1(erf(x));
    case OP_GELU: MAPD1(0.5 * x * erfc(-x * M_SQRT1_2));
    case OP_FLOOR: MAPD1(floor(x));
    case OP_CEIL: MAPD1(ceil(x));
    case OP_RECIPROCAL: MAPD1(1.0 / x);
    case OP_COPY:
    case OP_CAST: MAPD1(x);
    default: assert(!"not a unary f64 pointwise op");
    }
}

static void pw_binary_d(Op op, double *o, int64_t so, const double *a, int64_t sa, const double *b,
                        int64_t sb, int64_t n) {
    switch (op) {
    case OP_ADD: MAPD2(x + y);
    case OP_SUB: MAPD2(x - y);
    case OP_MUL: MAPD2(x * y);
    case OP_DIV:
    case OP_TRUE_DIV: MAPD2(x / y);
    case OP_POW: MAPD2(pow(x, y));
    case OP_FMOD: MAPD2(fmod(x, y));
    case OP_MAXIMUM: MAPD2(max_d(x, y));
    case OP_MINIMUM: MAPD2(min_d(x, y));
    case OP_LT: MAPD2(x < y);
    case OP_LE: MAPD2(x <= y);
    case OP_GT: MAPD2(x > y);
    case OP_GE: MAPD2(x >= y);
    case OP_EQ: MAPD2(x == y);
    case OP_NE: MAPD2(x != y);
    default: assert(!"not a binary f64 pointwise op");
    }
}

static void pw_unary(Op op, double *o, int64_t so, const double *a, int64_t sa, int64_t n) {
    switch (op) {
    case OP_NEG: MAP1(-x);
    case OP_ABS: MAP1(fabsf(x));
    case OP_RELU: MAP1(relu_f(x));
    case OP_SIGMOID: MAP1(sigmoid_f(x));
    case OP_TANH: MAP1(DBL(tanh, x));
    case OP_EXP: MAP1(DBL(exp, x));
    case OP_LOG: MAP1(DBL(log, x));
    case OP_SQRT: MAP1(sqrtf(x));
    case OP_RSQRT: MAP1((float)(1.0 / sqrt((double)x)));
    case OP_SIN: MAP1(DBL(sin, x));
    case OP_COS: MAP1(DBL(cos, x));
    case OP_ERF: MAP1(DBL(erf, x));
    case OP_GELU: MAP1((float)(0.5 * (double)x * erfc(-(double)x * M_SQRT1_2)));
    case OP_FLOOR: MAP1(floorf(x));
    case OP_CEIL: MAP1(ceilf(x));
    case OP_RECIPROCAL: MAP1(1.0f / x);
    case OP_LOGICAL_NOT: MAP1((float)(x == 0.0f));
    case OP_COPY:
    case OP_CAST: MAP1(x); /* to f32: x is the float */
    default: assert(!"not a unary pointwise op");
    }
}

static void pw_binary(Op op, double *o, int64_t so, const double *a, int64_t sa, const double *b,
                      int64_t sb, int64_t n) {
    switch (op) {
    case OP_ADD: MAP2(x + y);
    case OP_SUB: MAP2(x - y);
    case OP_MUL: MAP2(x * y);
    case OP_DIV: MAP2(x / y);
    case OP_TRUE_DIV: MAP2(x / y);
    case OP_POW: MAP2((float)pow((double)x, (double)y));
    case OP_FMOD: MAP2(fmodf(x, y));
    case OP_MAXIMUM: MAP2(max_f(x, y));
    case OP_MINIMUM: MAP2(min_f(x, y));
    case OP_LT: MAP2((float)(x < y));
    case OP_LE: MAP2((float)(x <= y));
    case OP_GT: MAP2((float)(x > y));
    case OP_GE: MAP2((float)(x >= y));
    case OP_EQ: MAP2((float)(x == y));
    case OP_NE: MAP2((float)(x != y));
    default: assert(!"not a binary pointwise op");
    }
}

static void pw_row(void *ctx, const int64_t *off, int64_t n, const int64_t *st) {
    const PwCtx *c = ctx;
    double *o = c->out + off[0];
    const double *a = c->in[0] + off[1];
    int arity = op_info[c->op].arity;
    if (arity == 1) {
        (c->f64 ? pw_unary_d : pw_unary)(c->op, o, st[0], a, st[1], n);
    } else if (arity == 2) {
        (c->f64 ? pw_binary_d : pw_binary)(c->op, o, st[0], a, st[1], c->in[1] + off[2], st[2], n);
    } else {
        assert(c->op == OP_WHERE);
        const double *b = c->in[1] + off[2], *e = c->in[2] + off[3];
        for (int64_t j = 0; j < n; j++) {
            double v = a[j * st[1]] != 0.0 ? b[j * st[2]] : e[j * st[3]];
            o[j * st[0]] = c->round ? (float)v : v;
        }
    }
}

/* Does node n compute in double? An f64 result, or an f64 operand (a
 * comparison of f64 values); a cast computes in its result's type. */
static bool computes_f64(const Interp *it, const Node *n) {
    if (n->dtype == KILN_F64) return true;
    if (n->op == OP_CAST) return false;
    for (int k = 0; k < n->nin; k++)
        if (node(it, n->in[k])->dtype == KILN_F64) return true;
    return false;
}

static void eval_pointwise(Interp *it, const Node *n, double *out) {
    PwCtx c = {.op = n->op, .f64 = computes_f64(it, n), .out = out};
    c.round = !c.f64 && n->dtype == KILN_F32;
    Nest s;
    assert(n->nin == op_info[n->op].arity && n->nin <= 3);
    nest_init(&s, n->rank, n->shape, 1 + n->nin);
    contiguous_strides(n->rank, n->shape, 1, s.stride[0]);
    for (int k = 0; k < n->nin; k++) {
        const Node *x = node(it, n->in[k]);
        bcast_strides(x->rank, x->shape, 1, n->rank, n->shape, s.stride[1 + k]);
        c.in[k] = operand(it, n, k);
    }
    nest_run(&s, pw_row, &c);
}

/* ===== reductions ======================================================== */

typedef struct {
    Op op;
    bool f64; /* else the operand is read as floats */
    double *acc;
    const double *in;
} RedCtx;

static void red_row(void *ctx, const int64_t *off, int64_t n, const int64_t *st) {
    const RedCtx *c = ctx;
    double *acc = c->acc + off[0];
    const double *x = c->in + off[1];
    int64_t sa = st[0], sx = st[1];
    for (int64_t j = 0; j < n; j++) {
        double v = c->f64 ? x[j * sx] : (float)x[j * sx], *r = &acc[j * sa];
        switch (c->op) {
        case OP_SUM: *r += v; break;
        case OP_PROD: *r *= v; break;
        case OP_AMAX:
            if (v > *r || v != v) *r = v;
            break; /* NaN sticks */
        case OP_AMIN:
            if (v < *r || v != v) *r = v;
            break;
        default: assert(!"not a reduction");
        }
    }
}

static double red_init(Op op) {
    switch (op) {
    case OP_SUM: return 0.0;
    case OP_PROD: return 1.0;
    case OP_AMAX: return -INFINITY;
    case OP_AMIN: return INFINITY;
    default: assert(!"not a reduction"); return 0.0;
    }
}

/* Walks the operand in C order, accumulating into a double per output
 * element: the accumulator is read with the output's strides over the
 * operand's dims, 0 along reduced dims. */
static kiln_status eval_reduction(Interp *it, int id, double *out) {
    const Node *n = node(it, id), *x = node(it, n->in[0]);
    int64_t on = node_numel(n), ostride[KILN_MAX_RANK], kept[KILN_MAX_RANK];
    bool reduced[KILN_MAX_RANK] = {false};
    for (int k = 0; k < n->nattr; k++) reduced[n->attr[k]] = true;
    for (int d = 0; d < x->rank; d++) /* the output's shape, keepdim style */
        kept[d] = reduced[d] ? 1 : x->shape[d];
    double *acc = scratch(it, id, on, sizeof(double));
    if (!acc) return KILN_ERR_NOMEM;
    for (int64_t i = 0; i < on; i++) acc[i] = red_init(n->op);
    bool f64 = n->dtype == KILN_F64;
    RedCtx c = {n->op, f64, acc, operand(it, n, 0)};
    Nest s;
    nest_init(&s, x->rank, x->shape, 2);
    contiguous_strides(x->rank, kept, 1, ostride);
    for (int d = 0; d < x->rank; d++) s.stride[0][d] = reduced[d] ? 0 : ostride[d];
    contiguous_strides(x->rank, x->shape, 1, s.stride[1]);
    nest_run(&s, red_row, &c);
    for (int64_t i = 0; i < on; i++) out[i] = f64 ? acc[i] : (float)acc[i];
    kfree(acc);
    return KILN_OK;
}

/* ===== views ============================================================= */

static void copy_row(void *ctx, const int64_t *off, int64_t n, const int64_t *st) {
    double *const *p = ctx; /* p[0] = out, p[1] = in */
    double *o = p[0] + off[0];
    const double *x = p[1] + off[1];
    for (int64_t j = 0; j < n; j++) o[j * st[0]] = x[j * st[1]];
}

/* The one strided gather every view uses:
 * out[i] = in[offset + sum_d idx_d * stride_d], i running over shape in C order. */
static void gather(double *out, const double *in, int rank, const int64_t *shape, int64_t offset,
                   const int64_t *stride) {
    Nest s;
    double *p[2] = {out, (double *)in};
    nest_init(&s, rank, shape, 2);
    contiguous_strides(rank, shape, 1, s.stride[0]);
    memcpy(s.stride[1], stride, sizeof(int64_t) * (size_t)rank);
    s.base[1] = offset;
    nest_run(&s, copy_row, p);
}

/* Constant padding, element by element: out[i] = x[i - before] where that
 * is inside x, else the value. */
static void eval_pad(Interp *it, const Node *n, double *out) {
    const Node *x = node(it, n->in[0]);
    const double *in = operand(it, n, 0);
    double value = n->dtype == KILN_F64 ? n->f[0] : (float)n->f[0];
    int64_t xs[KILN_MAX_RANK], total = node_numel(n);
    assert(n->attr[0] == KILN_PAD_CONSTANT && "edge/reflect pads are decomposed");
    contiguous_strides(x->rank, x->shape, 1, xs);
    for (int64_t i = 0; i < total; i++) {
        int64_t rest = i, off = 0;
        bool inside = true;
        for (int d = n->rank - 1; d >= 0; d--) {
            int64_t j = rest % n->shape[d] - n->attr[1 + d];
            rest /= n->shape[d];
            inside = inside && j >= 0 && j < x->shape[d];
            off += j * xs[d];
        }
        out[i] = inside ? in[off] : value;
    }
}

/* Concatenation: each part is a block of rows [outer, part size * inner]. */
static void eval_concat(Interp *it, const Node *n, double *out) {
    int d = (int)n->attr[0];
    int64_t outer = 1, inner = 1, at = 0;
    for (int k = 0; k < d; k++) outer *= n->shape[k];
    for (int k = d + 1; k < n->rank; k++) inner *= n->shape[k];
    for (int p = 0; p < n->nin; p++) {
        const double *in = operand(it, n, p);
        int64_t w = node(it, n->in[p])->shape[d] * inner;
        for (int64_t o = 0; o < outer; o++)
            memcpy(out + o * n->shape[d] * inner + at, in + o * w, sizeof(double) * (size_t)w);
        at += w;
    }
}

static void eval_view(Interp *it, const Node *n, double *out) {
    if (n->op == OP_PAD || n->op == OP_CONCAT) {
        (n->op == OP_PAD ? eval_pad : eval_concat)(it, n, out);
        return;
    }
    const Node *x = node(it, n->in[0]);
    const double *in = operand(it, n, 0);
    int64_t xs[KILN_MAX_RANK], st[KILN_MAX_RANK], offset = 0;
    contiguous_strides(x->rank, x->shape, 1, xs);
    switch (n->op) {
    case OP_PERMUTE: /* out dim d is in dim perm[d] */
        for (int d = 0; d < n->rank; d++) st[d] = xs[n->attr[d]];
        break;
    case OP_RESHAPE: /* the operand is contiguous: same data, new shape */
        assert(node_numel(n) == node_numel(x));
        contiguous_strides(n->rank, n->shape, 1, st);
        break;
    case OP_EXPAND: bcast_strides(x->rank, x->shape, 1, n->rank, n->shape, st); break;
    case OP_SLICE: { /* attr = {dim, start, end, step} */
        int dim = (int)n->attr[0];
        memcpy(st, xs, sizeof st);
        offset = n->attr[1] * xs[dim];
        st[dim] = xs[dim] * n->attr[3];
        break;
    }
    default: assert(!"not a view");
    }
    gather(out, in, n->rank, n->shape, offset, st);
}

/* ===== externs ============================================================ */

/* matmul: out[b, i, j] = sum_k a[b', i, k] * b[b'', k, j], batch dims
 * broadcast numpy-style. The inner loops run i, k, j so that b and the
 * double row accumulator are walked contiguously. */
typedef struct {
    const double *a, *b;
    double *out;
    int64_t m, k, n;
    double *row; /* n accumulators */
    bool f64;    /* an f64 result: not rounded to float */
} MmCtx;

static void mm_one(const MmCtx *c, const double *a, const double *b, double *o) {
    for (int64_t i = 0; i < c->m; i++) {
        for (int64_t j = 0; j < c->n; j++) c->row[j] = 0.0;
        for (int64_t p = 0; p < c->k; p++) {
            double aip = a[i * c->k + p];
            const double *brow = b + p * c->n;
            for (int64_t j = 0; j < c->n; j++) c->row[j] += aip * brow[j];
        }
        for (int64_t j = 0; j < c->n; j++) o[i * c->n + j] = c->f64 ? c->row[j] : (float)c->row[j];
    }
}

static void mm_row(void *ctx, const int64_t *off, int64_t n, const int64_t *st) {
    const MmCtx *c = ctx; /* one batch row: arrays are out, a, b */
    for (int64_t j = 0; j < n; j++)
        mm_one(c, c->a + off[1] + j * st[1], c->b + off[2] + j * st[2],
               c->out + off[0] + j * st[0]);
}

static kiln_status eval_matmul(Interp *it, int id, double *out) {
    const Node *n = node(it, id), *a = node(it, n->in[0]), *b = node(it, n->in[1]);
    assert(a->rank >= 2 && b->rank >= 2 && n->rank >= 2);
    int br = n->rank - 2;
    MmCtx c = {operand(it, n, 0),     operand(it, n, 1),     out,  a->shape[a->rank - 2],
               a->shape[a->rank - 1], b->shape[b->rank - 1], NULL, n->dtype == KILN_F64};
    assert(b->shape[b->rank - 2] == c.k);
    c.row = scratch(it, id, c.n, sizeof(double));
    if (!c.row) return KILN_ERR_NOMEM;
    Nest s;
    nest_init(&s, br, n->shape, 3);
    contiguous_strides(br, n->shape, c.m * c.n, s.stride[0]);
    bcast_strides(a->rank - 2, a->shape, c.m * c.k, br, n->shape, s.stride[1]);
    bcast_strides(b->rank - 2, b->shape, c.k * c.n, br, n->shape, s.stride[2]);
    nest_run(&s, mm_row, &c);
    kfree(c.row);
    return KILN_OK;
}

/* conv2d, NCHW, direct loops. Per (image, output channel) a double plane
 * accumulates; for each (input channel, kh, kw) tap, one pass adds
 * w * shifted input over the rows and columns the tap keeps in bounds. */
typedef struct {
    int64_t c, h, w, o, kh, kw, oh, ow;
    int64_t sh, sw, ph, pw, dh, dw, groups;
} ConvGeom;

static void conv_tap(const ConvGeom *q, double *plane, const double *img, double wv, int64_t kh,
                     int64_t kw) {
    for (int64_t y = 0; y < q->oh; y++) {
        int64_t iy = y * q->sh - q->ph + kh * q->dh;
        if (iy < 0 || iy >= q->h) continue;
        const double *irow = img + iy * q->w;
        for (int64_t x = 0; x < q->ow; x++) {
            int64_t ix = x * q->sw - q->pw + kw * q->dw;
            if (ix >= 0 && ix < q->w) plane[y * q->ow + x] += wv * irow[ix];
        }
    }
}

/* One output plane (image nb, output channel oc). */
static void conv_plane(const ConvGeom *q, double *plane, const double *x, const double *w,
                       const double *bias, int64_t nb, int64_t oc) {
    int64_t cpg = q->c / q->groups, opg = q->o / q->groups, g = oc / opg;
    double b0 = bias ? bias[oc] : 0.0;
    for (int64_t i = 0; i < q->oh * q->ow; i++) plane[i] = b0;
    for (int64_t ci = 0; ci < cpg; ci++) {
        const double *img = x + ((nb * q->c) + g * cpg + ci) * q->h * q->w;
        const double *ker = w + ((oc * cpg) + ci) * q->kh * q->kw;
        for (int64_t kh = 0; kh < q->kh; kh++)
            for (int64_t kw = 0; kw < q->kw; kw++)
                conv_tap(q, plane, img, ker[kh * q->kw + kw], kh, kw);
    }
}

static ConvGeom conv_geom(const Node *n, const Node *x, const Node *w) {
    ConvGeom q = {
        .c = x->shape[1],
        .h = x->shape[2],
        .w = x->shape[3],
        .o = w->shape[0],
        .kh = w->shape[2],
        .kw = w->shape[3],
        .oh = n->shape[2],
        .ow = n->shape[3],
        .sh = n->attr[0],
        .sw = n->attr[1],
        .ph = n->attr[2],
        .pw = n->attr[3],
        .dh = n->attr[4],
        .dw = n->attr[5],
        .groups = n->attr[6],
    };
    assert(q.groups >= 1 && q.c % q.groups == 0 && q.o % q.groups == 0);
    assert(w->shape[1] == q.c / q.groups);
    return q;
}

static kiln_status eval_conv2d(Interp *it, int id, double *out) {
    const Node *n = node(it, id), *x = node(it, n->in[0]), *w = node(it, n->in[1]);
    assert(x->rank == 4 && w->rank == 4 && n->rank == 4 && n->nattr >= 7);
    ConvGeom q = conv_geom(n, x, w);
    const double *bias = (n->nin > 2 && n->in[2] >= 0) ? operand(it, n, 2) : NULL;
    double *plane = scratch(it, id, q.oh * q.ow, sizeof(double));
    if (!plane) return KILN_ERR_NOMEM;
    for (int64_t nb = 0; nb < x->shape[0]; nb++)
        for (int64_t oc = 0; oc < q.o; oc++) {
            double *o = out + (nb * q.o + oc) * q.oh * q.ow;
            conv_plane(&q, plane, operand(it, n, 0), operand(it, n, 1), bias, nb, oc);
            for (int64_t i = 0; i < q.oh * q.ow; i++) o[i] = (float)plane[i];
        }
    kfree(plane);
    return KILN_OK;
}

/* gather (numpy.take): out[o, j, k] = data[o, idx[j], k] over the dims
 * before the axis (o), the indices' dims (j) and the dims after it (k). An
 * index is an integral float, negative from the end; the first bad one is
 * an input error, before anything is computed. */
static bool gather_index_ok(Interp *it, double v, int axis, int64_t size) {
    if (v != floor(v) || isinf(v))
        graph_fail(it->g, KILN_ERR_INPUT, "gather: index %g is not an integer", v);
    else if (v < (double)-size || v >= (double)size)
        graph_fail(it->g, KILN_ERR_INPUT, "gather: index %.0f out of range for dim %d of size %lld",
                   v, axis, (long long)size);
    else
        return true;
    return false;
}

static kiln_status eval_gather(Interp *it, int id, double *out) {
    const Node *n = node(it, id), *d = node(it, n->in[0]), *ix = node(it, n->in[1]);
    int axis = (int)n->attr[0];
    int64_t size = d->shape[axis], nidx = node_numel(ix), outer = 1, inner = 1;
    for (int k = 0; k < axis; k++) outer *= d->shape[k];
    for (int k = axis + 1; k < d->rank; k++) inner *= d->shape[k];
    const double *data = operand(it, n, 0), *idx = operand(it, n, 1);
    for (int64_t j = 0; j < nidx; j++)
        if (!gather_index_ok(it, idx[j], axis, size)) return KILN_ERR_INPUT;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < nidx; j++) {
            int64_t p = (int64_t)idx[j] < 0 ? (int64_t)idx[j] + size : (int64_t)idx[j];
            for (int64_t k = 0; k < inner; k++)
                out[(o * nidx + j) * inner + k] = data[(o * size + p) * inner + k];
        }
    return KILN_OK;
}

/* conv_transpose2d, NCHW, weight (C_in, C_out/groups, kH, kW): direct
 * scatter. Input pixel (ih, iw) of channel ci, through tap (i, j), adds
 * x * w[ci, c, i, j] to output (ih*sh - ph + i*dh, iw*sw - pw + j*dw) of
 * channel g*cog + c, accumulated in double over the whole output. */
typedef struct {
    int64_t n, c, h, w, o, kh, kw, oh, ow;
    int64_t sh, sw, ph, pw, dh, dw, groups;
} CtGeom;

static void ct_pixel(const CtGeom *q, double *acc, const double *w, double xv, int64_t nb,
                     int64_t ci, int64_t ih, int64_t iw) {
    int64_t cog = q->o / q->groups, g = ci / (q->c / q->groups);
    for (int64_t c = 0; c < cog; c++)
        for (int64_t i = 0; i < q->kh; i++) {
            int64_t oy = ih * q->sh - q->ph + i * q->dh;
            if (oy < 0 || oy >= q->oh) continue;
            for (int64_t j = 0; j < q->kw; j++) {
                int64_t ox = iw * q->sw - q->pw + j * q->dw;
                if (ox < 0 || ox >= q->ow) continue;
                double wv = w[((ci * cog + c) * q->kh + i) * q->kw + j];
                acc[((nb * q->o + g * cog + c) * q->oh + oy) * q->ow + ox] += xv * wv;
            }
        }
}

static kiln_status eval_conv_transpose2d(Interp *it, int id, double *out) {
    const Node *n = node(it, id), *x = node(it, n->in[0]), *w = node(it, n->in[1]);
    const int64_t *a = n->attr;
    CtGeom q = {x->shape[0], x->shape[1], x->shape[2], x->shape[3], n->shape[1], w->shape[2],
                w->shape[3], n->shape[2], n->shape[3], a[0],        a[1],        a[2],
                a[3],        a[6],        a[7],        a[8]};
    assert(n->nattr == 9 && w->shape[0] == q.c && w->shape[1] * q.groups == q.o);
    const double *xd = operand(it, n, 0), *wd = operand(it, n, 1);
    const double *bias = (n->nin > 2 && n->in[2] >= 0) ? operand(it, n, 2) : NULL;
    int64_t numel = node_numel(n), plane = q.oh * q.ow;
    double *acc = scratch(it, id, numel, sizeof(double));
    if (!acc) return KILN_ERR_NOMEM;
    for (int64_t i = 0; i < numel; i++) acc[i] = bias ? bias[i / plane % q.o] : 0.0;
    for (int64_t nb = 0; nb < q.n; nb++)
        for (int64_t ci = 0; ci < q.c; ci++)
            for (int64_t ih = 0; ih < q.h; ih++)
                for (int64_t iw = 0; iw < q.w; iw++)
                    ct_pixel(&q, acc, wd, xd[((nb * q.c + ci) * q.h + ih) * q.w + iw], nb, ci, ih,
                             iw);
    for (int64_t i = 0; i < numel; i++) out[i] = (float)acc[i];
    kfree(acc);
    return KILN_OK;
}

/* ===== one node =========================================================== */

/* A value as the interpreter holds it: an f64 one as it is (borrowed),
 * any other (f32 data, bools as 0/1 floats) converted into a new double
 * array. */
static kiln_status hold(Interp *it, int id, const void *data) {
    const Node *n = node(it, id);
    if (n->dtype == KILN_F64) {
        it->val[id] = (Val){(double *)data, false};
        return KILN_OK;
    }
    int64_t numel = node_numel(n);
    double *d = scratch(it, id, numel, sizeof(double));
    if (!d) return KILN_ERR_NOMEM;
    const float *f = data;
    for (int64_t i = 0; i < numel; i++) d[i] = f[i];
    it->val[id] = (Val){d, true};
    return KILN_OK;
}

/* ===== calls of sub-programs (control flow) ================================ */

/* One run of a body: inputs and outputs are doubles, as the interpreter
 * holds values; they go in and come out in the body's dtype. A failure in
 * the body becomes the caller's, named by the call. */
static kiln_status body_run(Interp *it, int id, Graph *body, const double *const *in,
                            double *const *out) {
    int nin = body->ninputs, nout = body->noutputs;
    float **bin = kcalloc((size_t)nin + 1, sizeof(float *));
    float **bout = kcalloc((size_t)nout + 1, sizeof(float *));
    kiln_status st = bin && bout ? KILN_OK : KILN_ERR_NOMEM;
    for (int k = 0; k < nin && st == KILN_OK; k++) {
        const Node *x = &body->nodes[body->inputs[k]];
        int64_t numel = node_numel(x);
        if (!(bin[k] = scratch(it, id, numel, (size_t)loop_storage_size(x->dtype)))) {
            st = KILN_ERR_NOMEM;
            break;
        }
        for (int64_t e = 0; e < numel; e++)
            if (x->dtype == KILN_F64)
                ((double *)bin[k])[e] = in[k][e];
            else
                bin[k][e] = (float)in[k][e];
    }
    if (st == KILN_OK) st = interp_run_perturbed(body, bin, bout, it->perturb);
    for (int k = 0; k < nout && st == KILN_OK; k++) {
        const Node *y = &body->nodes[body->outputs[k]];
        for (int64_t e = 0; e < node_numel(y); e++)
            out[k][e] = y->dtype == KILN_F64 ? ((double *)bout[k])[e] : bout[k][e];
    }
    for (int k = 0; bin && k < nin; k++) kfree(bin[k]);
    for (int k = 0; bout && k < nout; k++) kfree(bout[k]);
    kfree(bin);
    kfree(bout);
    if (st != KILN_OK) {
        const GraphCall *c = node(it, id)->call;
        graph_fail(it->g, st, "%s: %s", c->label ? c->label : "call",
                   body->status ? body->err : "out of memory");
        graph_clear_error(body);
    }
    return st;
}

static kiln_status eval_if(Interp *it, int id, const GraphCall *c, const double *in, double *out) {
    int b = in[0] != 0 ? 0 : 1;
    Graph *B = c->body[b];
    if (!B) {
        char msg[1024];
        graph_call_refusal(c, b, msg, sizeof msg);
        graph_fail(it->g, KILN_ERR_INPUT, "%s", msg);
        return KILN_ERR_INPUT;
    }
    const double *p = in + 1;
    for (int k = 0; b && k < graph_call_ncap(c, 0); k++)
        p += graph_call_numel(c->body[0], false, k);
    const double **bin = kcalloc((size_t)B->ninputs + 1, sizeof(double *));
    double **bout = kcalloc((size_t)B->noutputs + 1, sizeof(double *));
    kiln_status st = bin && bout ? KILN_OK : KILN_ERR_NOMEM;
    for (int k = 0; st == KILN_OK && k < B->ninputs; k++) {
        bin[k] = p;
        p += graph_call_numel(B, false, k);
    }
    for (int k = 0; st == KILN_OK && k < B->noutputs; k++) {
        bout[k] = out;
        out += graph_call_numel(B, true, k);
    }
    if (st == KILN_OK) st = body_run(it, id, B, bin, bout);
    kfree(bin);
    kfree(bout);
    return st;
}

/* ONNX Loop and Scan (graph.h, GraphCall): the body runs while the trip
 * count and the condition allow, reading the states of the last iteration
 * and writing the next ones to the other of two places. */
static kiln_status eval_loop(Interp *it, int id, const GraphCall *c, const double *in,
                             double *out) {
    Graph *B = c->body[0];
    int fi = c->loop ? 2 : 0, fo = c->loop ? 1 : 0, ncap = graph_call_ncap(c, 0);
    int64_t trips = c->trips, S = 0, scans_out = 0;
    bool go = true;
    if (c->has_trip) trips = graph_call_trips(*in++);
    if (c->has_cond) go = *in++ != 0;
    for (int k = 0; k < c->nstate; k++) S += graph_call_numel(B, false, fi + k);
    for (int k = 0; k < c->nscan_out; k++)
        scans_out += c->trips * graph_call_numel(B, true, fo + c->nstate + k);
    const double *state_in = in, *scan_in = in + S, *caps = scan_in;
    for (int m = 0; m < c->nscan_in; m++)
        caps += c->trips * graph_call_numel(B, false, fi + c->nstate + m);
    double *tmp = out + S + scans_out, *iter = tmp + S, *cin = iter + 1, *cout = iter + 2;
    memset(tmp, 0, sizeof(double) * (size_t)(S + (c->loop ? 3 : 0)));
    const double **bin = kcalloc((size_t)B->ninputs + 1, sizeof(double *));
    double **bout = kcalloc((size_t)B->noutputs + 1, sizeof(double *));
    kiln_status st = bin && bout ? KILN_OK : KILN_ERR_NOMEM;
    const double *R = state_in;
    double *W = tmp;
    for (int64_t i = 0; st == KILN_OK && go && (trips < 0 || i < trips); i++) {
        int a = 0, o = 0;
        if (c->loop) {
            *iter = (double)i, *cin = 1;
            bin[a++] = iter, bin[a++] = cin, bout[o++] = cout;
        }
        int64_t off = 0;
        for (int k = 0; k < c->nstate; k++) {
            bin[a++] = R + off;
            bout[o++] = W + off;
            off += graph_call_numel(B, false, fi + k);
        }
        const double *sp = scan_in;
        for (int m = 0; m < c->nscan_in; m++) {
            int64_t sl = graph_call_numel(B, false, a);
            bin[a++] = sp + i * sl;
            sp += c->trips * sl;
        }
        double *so = out + S;
        for (int k = 0; k < c->nscan_out; k++) {
            int64_t sl = graph_call_numel(B, true, o);
            bout[o++] = so + i * sl;
            so += c->trips * sl;
        }
        const double *cp = caps;
        for (int k = 0; k < ncap; k++) {
            bin[a] = cp;
            cp += graph_call_numel(B, false, a++);
        }
        st = body_run(it, id, B, bin, bout);
        if (c->loop) go = *cout != 0;
        R = W;
        W = W == tmp ? out : tmp;
    }
    if (st == KILN_OK && R != out && S) memcpy(out, R, sizeof(double) * (size_t)S);
    kfree(bin);
    kfree(bout);
    return st;
}

static kiln_status eval_call(Interp *it, int id, double *out) {
    const Node *n = node(it, id);
    const double *in = operand(it, n, 0);
    return n->call->kind == CALL_IF ? eval_if(it, id, n->call, in, out)
                                    : eval_loop(it, id, n->call, in, out);
}

/* Compute node id into a new buffer (f64 sources are borrowed). */
static kiln_status eval_node(Interp *it, int id) {
    const Node *n = node(it, id);
    OpKind kind = op_info[n->op].kind;
    assert(kind != KIND_COMPOSITE && "interp_run needs a decomposed graph");
    if (n->op == OP_INPUT) return KILN_OK; /* set up by interp_run */
    if (n->op == OP_WEIGHT) return hold(it, id, n->data);
    int64_t numel = node_numel(n);
    assert(numel >= 0);
    double *out = scratch(it, id, numel, sizeof(double));
    if (!out) return KILN_ERR_NOMEM;
    it->val[id] = (Val){out, true};
    switch (kind) {
    case KIND_SOURCE: /* CONST: the double; an f32 op reads it as a float */
        assert(n->op == OP_CONST);
        out[0] = n->f[0];
        return KILN_OK;
    case KIND_POINTWISE: eval_pointwise(it, n, out); return KILN_OK;
    case KIND_REDUCTION: return eval_reduction(it, id, out);
    case KIND_VIEW: eval_view(it, n, out); return KILN_OK;
    case KIND_EXTERN:
        switch (n->op) {
        case OP_MATMUL: return eval_matmul(it, id, out);
        case OP_GATHER: return eval_gather(it, id, out);
        case OP_CONV_TRANSPOSE2D: return eval_conv_transpose2d(it, id, out);
        case OP_CALL: return eval_call(it, id, out);
        default: return eval_conv2d(it, id, out);
        }
    case KIND_RANDOM: /* counter-based: element i depends on (seed, i) only */
        assert(n->op == OP_RAND);
        for (int64_t i = 0; i < numel; i++) out[i] = util_rand_uniform(n->seed, (uint64_t)i);
        return KILN_OK;
    default: assert(!"unknown op kind"); return KILN_ERR_INPUT;
    }
}

static void release(Interp *it, int id) {
    Val *v = &it->val[id];
    if (v->owned) kfree(v->data);
    *v = (Val){NULL, false};
}

/* Node id has run (or was skipped): each operand slot gives up its use
 * (graph_use_counts counts slots, so x * x holds x twice), and a value
 * whose last user has run is freed. */
static void drop_operands(Interp *it, int id) {
    const Node *n = node(it, id);
    for (int k = 0; k < n->nin; k++) {
        int x = n->in[k];
        if (x < 0) continue;
        assert(it->uses[x] > 0);
        if (--it->uses[x] == 0) release(it, x);
    }
}

/* Each output in a new array of its storage type (doubles for f64, else
 * floats). On failure the arrays made so far are freed. */
static kiln_status hand_outputs(Interp *it, float **outputs) {
    Graph *g = it->g;
    for (int i = 0; i < g->noutputs; i++) {
        int id = g->outputs[i];
        const Node *n = node(it, id);
        const double *v = it->val[id].data;
        int64_t numel = node_numel(n);
        outputs[i] = scratch(it, id, numel, (size_t)loop_storage_size(n->dtype));
        if (!outputs[i]) {
            for (int j = 0; j < i; j++) kfree(outputs[j]);
            memset(outputs, 0, sizeof(float *) * (size_t)g->noutputs);
            return KILN_ERR_NOMEM;
        }
        if (n->dtype == KILN_F64 && numel > 0)
            memcpy(outputs[i], v, sizeof(double) * (size_t)numel);
        else
            for (int64_t k = 0; k < numel; k++) outputs[i][k] = (float)v[k];
    }
    return KILN_OK;
}

/* kiln_interpret_perturbed: node id's float result, each element times
 * 1 + u r with u uniform in [-1, 1] (counter-based: seed, node, element)
 * and r about the error fused float code may make there: 2^-22 (two ulps)
 * after a pointwise op, 2^-23 sqrt(n) after a reduction or a product over
 * n terms (float accumulation in another order). Views and gathers move
 * values exactly and are left alone, as are bool results. */
static void perturb(Interp *it, int id) {
    const Node *n = node(it, id);
    OpKind kind = op_info[n->op].kind;
    if (n->dtype != KILN_F32 || !it->val[id].owned || n->op == OP_GATHER ||
        (kind != KIND_POINTWISE && kind != KIND_REDUCTION && kind != KIND_EXTERN))
        return;
    double r = 0x1p-22;
    if (kind != KIND_POINTWISE) {
        const Node *a = n->nin > 0 && n->in[0] >= 0 ? node(it, n->in[0]) : NULL;
        int64_t len = 1;
        if (kind == KIND_REDUCTION && a && node_numel(n) > 0)
            len = node_numel(a) / node_numel(n);
        else if (n->op == OP_MATMUL && a && a->rank)
            len = a->shape[a->rank - 1];
        else if (n->nin > 1 && node(it, n->in[1])->rank == 4) { /* conv weights */
            const Node *w = node(it, n->in[1]);
            len = w->shape[1] * w->shape[2] * w->shape[3];
        }
        r = 0x1p-23 * sqrt((double)(len > 1 ? len : 1));
    }
    double *v = it->val[id].data;
    uint64_t seed = it->perturb * 0x9E3779B97F4A7C15ull + (uint64_t)id;
    for (int64_t i = 0; i < node_numel(n); i++)
        v[i] = (float)v[i] * (float)(1.0 + (2.0 * util_rand_uniform(seed, (uint64_t)i) - 1.0) * r);
}

static kiln_status run_nodes(Interp *it, float *const *inputs) {
    Graph *g = it->g;
    for (int i = 0; i < g->ninputs; i++) {
        kiln_status st = hold(it, g->inputs[i], inputs[i]);
        if (st != KILN_OK) return st;
    }
    for (int id = 0; id < g->n; id++) {
        if (it->uses[id] > 0) { /* a value nobody reads is not computed */
            kiln_status st = eval_node(it, id);
            if (st != KILN_OK) return st;
            if (it->perturb) perturb(it, id);
        }
        drop_operands(it, id);
    }
    return KILN_OK;
}

kiln_status interp_run(Graph *g, float *const *inputs, float **outputs) {
    return interp_run_perturbed(g, inputs, outputs, 0);
}

kiln_status interp_run_perturbed(Graph *g, float *const *inputs, float **outputs, uint64_t seed) {
    Interp it = {g, NULL, NULL, seed};
    it.uses = graph_use_counts(g);
    it.val = kcalloc((size_t)g->n + 1, sizeof(Val));
    if (!it.uses || !it.val) {
        kfree(it.uses);
        kfree(it.val);
        graph_fail(g, KILN_ERR_NOMEM, "out of memory: %lld bytes for the interpreter's tables",
                   (long long)((size_t)g->n * (sizeof(Val) + sizeof(int))));
        return KILN_ERR_NOMEM;
    }
    kiln_status st = run_nodes(&it, inputs);
    if (st == KILN_OK) st = hand_outputs(&it, outputs);
    for (int id = 0; id < g->n; id++) release(&it, id);
    kfree(it.val);
    kfree(it.uses);
    return st;
}

/* ===== the public entry point ============================================= */

static kiln_status check_input(Graph *g, int i, const kiln_tensor *t) {
    char err[512];
    kiln_status st = graph_check_input(g, i, t, err, sizeof err);
    if (st != KILN_OK) graph_fail(g, st, "%s", err);
    return st;
}

/* Everything kiln_interpret allocates, so one function can free it. */
typedef struct {
    Graph *dec;     /* the decomposed graph */
    float **in;     /* per input: the float data interp_run reads */
    bool *in_owned; /* in[i] was converted (bool) and must be freed */
    float **out;    /* per output: interp_run's result */
    int nin, nout;
} Run;

static void run_free(Run *r) {
    for (int i = 0; r->in && r->in_owned && i < r->nin; i++)
        if (r->in_owned[i]) kfree(r->in[i]);
    for (int i = 0; r->out && i < r->nout; i++) kfree(r->out[i]);
    kfree(r->in);
    kfree(r->in_owned);
    kfree(r->out);
    if (r->dec) kiln_graph_free(r->dec);
}

static kiln_status convert_inputs(Graph *g, Run *r, const kiln_tensor *inputs) {
    for (int i = 0; i < r->nin; i++) {
        const kiln_tensor *t = &inputs[i];
        if (t->dtype == KILN_F32 || t->dtype == KILN_F64) { /* as interp_run reads them */
            r->in[i] = t->data;
            continue;
        }
        int64_t n = kiln_tensor_numel(t);
        r->in[i] = kmalloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
        if (!r->in[i]) {
            graph_fail(g, KILN_ERR_NOMEM, "out of memory: %lld bytes for input '%s'",
                       (long long)(sizeof(float) * (size_t)n), kiln_input_name(g, i));
            return KILN_ERR_NOMEM;
        }
        r->in_owned[i] = true;
        const unsigned char *bytes = t->data;
        for (int64_t k = 0; k < n; k++) r->in[i][k] = bytes[k] ? 1.0f : 0.0f;
    }
    return KILN_OK;
}

/* Output i of the decomposed graph as a new tensor (f32 or bool bytes). */
static kiln_status convert_output(Graph *g, const Run *r, int i, kiln_tensor *t) {
    const Node *n = graph_node(r->dec, r->dec->outputs[i]);
    assert(n->dtype == KILN_F32 || n->dtype == KILN_F64 || n->dtype == KILN_BOOL);
    *t = (kiln_tensor){.dtype = n->dtype, .rank = n->rank};
    memcpy(t->shape, n->shape, sizeof(int64_t) * (size_t)n->rank);
    if (kiln_tensor_alloc(t) != KILN_OK) {
        graph_fail(g, KILN_ERR_NOMEM, "out of memory: output '%s'", kiln_output_name(g, i));
        return KILN_ERR_NOMEM;
    }
    int64_t numel = kiln_tensor_numel(t);
    if (n->dtype != KILN_BOOL && numel > 0)
        memcpy(t->data, r->out[i], (size_t)loop_storage_size(n->dtype) * (size_t)numel);
    for (int64_t k = 0; n->dtype == KILN_BOOL && k < numel; k++)
        ((unsigned char *)t->data)[k] = r->out[i][k] != 0.0f;
    return KILN_OK;
}

static kiln_status run_alloc(Graph *g, Run *r) {
    r->dec = kiln_graph_new();
    r->in = kcalloc((size_t)r->nin + 1, sizeof(float *));
    r->in_owned = kcalloc((size_t)r->nin + 1, sizeof(bool));
    r->out = kcalloc((size_t)r->nout + 1, sizeof(float *));
    if (r->dec && r->in && r->in_owned && r->out) return KILN_OK;
    graph_fail(g, KILN_ERR_NOMEM, "out of memory: interpreter set-up");
    return KILN_ERR_NOMEM;
}

/* Decompose, run, convert: every step's failure lands in g. */
static kiln_status interpret(Graph *g, Run *r, const kiln_tensor *inputs, kiln_tensor *outputs,
                             uint64_t seed) {
    kiln_status st = run_alloc(g, r);
    if (st == KILN_OK && (st = dec_run(g, r->dec)) != KILN_OK) {
        graph_fail(g, st, "%s", kiln_error(r->dec));
        return st;
    }
    if (st == KILN_OK) st = convert_inputs(g, r, inputs);
    if (st == KILN_OK && (st = interp_run_perturbed(r->dec, r->in, r->out, seed)) != KILN_OK) {
        graph_fail(g, st, "%s", kiln_error(r->dec));
        return st;
    }
    for (int i = 0; st == KILN_OK && i < r->nout; i++)
        if ((st = convert_output(g, r, i, &outputs[i])) != KILN_OK)
            for (int j = 0; j < i; j++) kiln_tensor_free(&outputs[j]);
    return st;
}

kiln_status kiln_interpret(kiln_graph *g, const kiln_tensor *inputs, kiln_tensor *outputs) {
    return kiln_interpret_perturbed(g, inputs, outputs, 0);
}

kiln_status kiln_interpret_perturbed(kiln_graph *g, const kiln_tensor *inputs, kiln_tensor *outputs,
                                     uint64_t seed) {
    assert(g);
    if (g->status != KILN_OK) return g->status;
    Run r = {.nin = kiln_num_inputs(g), .nout = kiln_num_outputs(g)};
    assert((inputs || r.nin == 0) && (outputs || r.nout == 0));
    kiln_status st = KILN_OK;
    for (int i = 0; i < r.nin && st == KILN_OK; i++) st = check_input(g, i, &inputs[i]);
    if (st == KILN_OK) st = interpret(g, &r, inputs, outputs, seed);
    if (st != KILN_OK && r.nout > 0) memset(outputs, 0, sizeof(kiln_tensor) * (size_t)r.nout);
    run_free(&r);
    /* A failed run leaves its message but not a sticky status: the graph
     * itself is fine and may run again with other inputs. */
    g->status = KILN_OK;
    return st;
}
