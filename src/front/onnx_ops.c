/*
 * onnx_ops.c -- one ONNX node into kiln graph ops (or into a constant).
 *
 * Each supported op has a handler in the table at the end. A handler reads
 * its inputs (OxVal: constant or graph value) and attributes, and sets its
 * outputs. Two paths:
 *
 * - Constant folding. When every input of a node is a constant and the op
 *   has a host evaluator (the shape arithmetic exported models are full of:
 *   Shape, Gather, Concat, Unsqueeze, Slice, Cast, Range, Add, Mul, ...),
 *   the result is computed here, in doubles, and stays a constant. Inputs
 *   that must be known to build the graph (Reshape's shape, Slice's starts,
 *   ReduceSum's axes, Pad's pads, ...) are then constants in every sensible
 *   model, and a clear error otherwise.
 * - Graph building. Otherwise the node maps to kiln builders, decomposed
 *   where kiln has no op of its own (LeakyRelu = where(x < 0, a*x, x),
 *   ArgMax = amax + where(x == max, iota, BIG) + amin, Tile = reshape,
 *   expand, reshape views, a 1-D conv = a 2-D conv of height 1, ...).
 *
 * Types: kiln graphs compute in f32 and bool, so int32/int64 values are f32
 * in the graph (exact below 2^24; a constant beyond that is an error when it
 * reaches the graph). OxVal.type keeps the ONNX type, which decides integer
 * division, Cast and the type of the model's outputs.
 */
#include "front/front.h"
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers: failures, attributes, inputs and outputs ---------------------- */

static bool nfail(OxNode *n, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool nfail(OxNode *n, const char *fmt, ...) {
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    graph_fail(n->im->g, KILN_ERR_INPUT, "%s", msg);
    return false;
}

static bool nomem(OxNode *n) {
    graph_fail(n->im->g, KILN_ERR_NOMEM, "out of memory");
    return false;
}

static const Onnx__AttributeProto *attr(const OxNode *n, const char *name) {
    for (size_t i = 0; i < n->n->n_attribute; i++)
        if (n->n->attribute[i]->name && !strcmp(n->n->attribute[i]->name, name))
            return n->n->attribute[i];
    return NULL;
}

static int64_t attr_i(const OxNode *n, const char *name, int64_t def) {
    const Onnx__AttributeProto *a = attr(n, name);
    return a ? a->i : def;
}

static double attr_f(const OxNode *n, const char *name, double def) {
    const Onnx__AttributeProto *a = attr(n, name);
    return a ? a->f : def;
}

/* A string attribute compared with s (absent: def). */
static bool attr_is(const OxNode *n, const char *name, const char *s, bool def) {
    const Onnx__AttributeProto *a = attr(n, name);
    if (!a) return def;
    return a->s.len == strlen(s) && !memcmp(a->s.data, s, a->s.len);
}

/* An ints attribute into out (at most max); its count, or -1 when absent. */
static int attr_ints(OxNode *n, const char *name, int64_t *out, int max) {
    const Onnx__AttributeProto *a = attr(n, name);
    if (!a) return -1;
    if (a->n_ints > (size_t)max) return nfail(n, "attribute %s has too many values", name), -2;
    for (size_t i = 0; i < a->n_ints; i++) out[i] = a->ints[i];
    return (int)a->n_ints;
}

static OxVal *in(const OxNode *n, int k) { return k < n->nin ? n->in[k] : NULL; }

static bool need_in(OxNode *n, int k) {
    return in(n, k) ? true : nfail(n, "input %d is required", k);
}

static const char *opname(const OxNode *n) { return n->n->op_type; }

/* Output k's value slot, or NULL when the model does not use it (or out
 * of memory: the graph's error says so). */
static OxVal *out_slot(OxNode *n, int k) {
    if (k >= (int)n->n->n_output || !n->n->output[k][0]) return NULL;
    OxVal *o = ox_val(n->im, n->n->output[k]);
    if (!o) nomem(n);
    return o;
}

static bool set_graph(OxNode *n, int k, kiln_value v, int type) {
    if (v < 0) return false;
    OxVal *o = out_slot(n, k);
    if (!o) return k < (int)n->n->n_output && n->n->output[k][0] ? nomem(n) : true;
    o->type = type;
    o->v = v;
    o->c = NULL;
    o->rank = kiln_value_rank(n->im->g, v);
    memcpy(o->shape, kiln_value_shape(n->im->g, v), sizeof(int64_t) * (size_t)o->rank);
    return true;
}

/* A new constant for output k (data uninitialized); a scratch value when
 * the output is unused. NULL when out of memory. */
static OxVal *set_const(OxNode *n, int k, int type, int rank, const int64_t *shape) {
    OxVal *o = out_slot(n, k);
    if (!o) o = arena_alloc(&n->im->arena, sizeof *o);
    if (!o) return NULL;
    int64_t numel = util_numel(rank, shape);
    if (rank > KILN_MAX_RANK || numel < 0 || numel > ((int64_t)1 << 31)) return NULL;
    o->type = type;
    o->rank = rank;
    if (rank) memmove(o->shape, shape, sizeof(int64_t) * (size_t)rank);
    o->v = KILN_NONE;
    o->c = arena_alloc(&n->im->arena, sizeof(double) * (size_t)(numel ? numel : 1));
    return o->c ? o : NULL;
}

static bool all_const(const OxNode *n) {
    for (int k = 0; k < n->nin; k++)
        if (n->in[k] && !n->in[k]->c) return false;
    return true;
}

static bool is_int_type(int t) {
    return t == OT_INT32 || t == OT_INT64 || t == OT_INT8 || t == OT_INT16 || t == OT_UINT8 ||
           t == OT_UINT16 || t == OT_UINT32 || t == OT_UINT64;
}

static bool graph_type_ok(int t) { return t == OT_FLOAT || t == OT_BOOL || is_int_type(t); }

static const char *unnamed(OxImp *im, char *buf, size_t len) {
    util_fmt(buf, len, "onnx:const:%d", im->nconst++);
    return buf;
}

/* A constant as a weight (f32, ints exact below 2^24), a scalar (rank 0),
 * or a bool (a weight compared with 0). */
static kiln_value materialize(OxNode *n, OxVal *v) {
    Graph *g = n->im->g;
    int64_t numel = ox_numel(v);
    if (!graph_type_ok(v->type))
        return nfail(n, "unsupported: element type %s in the graph", ox_type_name(v->type)),
               KILN_NONE;
    if (numel == 0)
        return nfail(n, "unsupported: the constant '%s' is empty (kiln tensors are non-empty)",
                     v->name ? v->name : ""),
               KILN_NONE;
    for (int64_t k = 0; is_int_type(v->type) && k < numel; k++)
        if (fabs(v->c[k]) > 16777216.0)
            return nfail(n, "the integer constant '%s' holds %.17g, beyond what f32 holds "
                         "exactly (2^24)", v->name, v->c[k]), KILN_NONE;
    if (v->rank == 0 && v->type != OT_BOOL) return kiln_scalar(g, (float)v->c[0]);
    float *f = kmalloc(sizeof(float) * (size_t)numel);
    if (!f) return nomem(n), KILN_NONE;
    for (int64_t k = 0; k < numel; k++) f[k] = (float)v->c[k];
    char buf[64];
    const char *name = v->name && v->name[0] ? v->name : unnamed(n->im, buf, sizeof buf);
    kiln_value w = kiln_weight(g, name, v->rank, v->shape, f);
    kfree(f);
    if (v->type == OT_BOOL) w = kiln_binary(g, "ne", w, kiln_scalar(g, 0));
    return w;
}

kiln_value ox_graph(OxNode *n, OxVal *v) {
    if (v->v >= 0 || !v->c) return v->v;
    return v->v = materialize(n, v);
}

/* A model output that folded to a constant: a weight even at rank 0 (a
 * scalar constant node is not a buffer the runtime can hand out). */
kiln_value ox_graph_output(OxNode *n, OxVal *v) {
    if (v->v >= 0 || !v->c || v->rank > 0 || v->type == OT_BOOL || !graph_type_ok(v->type) ||
        fabs(v->c[0]) > 16777216.0)
        return ox_graph(n, v);   /* and its checks */
    float f = (float)v->c[0];
    char buf[64];
    const char *name = v->name && v->name[0] ? v->name : unnamed(n->im, buf, sizeof buf);
    return v->v = kiln_weight(n->im->g, name, 0, NULL, &f);
}

static kiln_value gin(OxNode *n, int k) {
    OxVal *v = in(n, k);
    if (!v) return nfail(n, "input %d is required", k), KILN_NONE;
    return ox_graph(n, v);
}

/* A constant as an integer, saturated (INT64_MAX ends a Slice), NaN 0. */
static int64_t to_i64(double d) {
    return isnan(d) ? 0 : d >= 9.2e18 ? INT64_MAX : d <= -9.2e18 ? INT64_MIN : (int64_t)d;
}

/* The values of v where a constant is needed: a constant's, or those of
 * a specialized input; NULL when only the run knows them. */
static const double *known(const OxVal *v) { return v->c ? v->c : v->spec; }

/* Constant input k as integers (at most max); its count, or -1 with an error. */
static int const_ints(OxNode *n, int k, int64_t *out, int max, const char *what) {
    OxVal *v = in(n, k);
    if (!v) return nfail(n, "the %s input is required", what), -1;
    const double *c = known(v);
    if (!c)
        return nfail(n, "unsupported: the %s input '%s' is computed at run time (kiln's "
                     "shapes are static: give its value, kiln run -i %s=FILE)", what, v->name,
                     v->name), -1;
    int64_t m = ox_numel(v);
    if (m > max)
        return nfail(n, "the %s input has %lld values, at most %d", what, (long long)m, max), -1;
    for (int64_t i = 0; i < m; i++) {
        out[i] = to_i64(c[i]);
    }
    return (int)m;
}

/* Axes from attribute "axes" (opset < since) or input k; -1 when absent. */
static int get_axes(OxNode *n, int since, int k, int64_t *axes, int max) {
    if (n->im->opset < since) return attr_ints(n, "axes", axes, max);
    if (!in(n, k)) return -1;
    return const_ints(n, k, axes, max, "axes");
}

static bool norm_axis(OxNode *n, int64_t *a, int rank) {
    if (*a < -rank || *a >= rank)
        return nfail(n, "axis %lld is out of range for rank %d", (long long)*a, rank);
    if (*a < 0) *a += rank;
    return true;
}

/* ---- constant evaluation: broadcasting over up to three operands --------- */

typedef double (*EvalFn)(double a, double b, double c, int type);

static bool bcast_shape(OxNode *n, int nv, OxVal **v, int *rank, int64_t *shape) {
    *rank = 0;
    for (int k = 0; k < nv; k++) if (v[k]->rank > *rank) *rank = v[k]->rank;
    for (int d = 0; d < *rank; d++) shape[d] = 1;
    for (int k = 0; k < nv; k++)
        for (int d = 0; d < v[k]->rank; d++) {
            int64_t *o = &shape[*rank - v[k]->rank + d], s = v[k]->shape[d];
            if (s == *o || s == 1) continue;
            if (*o != 1) return nfail(n, "shapes cannot be broadcast");
            *o = s;
        }
    return true;
}

/* Offset in v of the output element with multi-index idx (broadcast). */
static int64_t bcast_offset(const OxVal *v, int rank, const int64_t *idx) {
    int64_t off = 0;
    for (int d = 0; d < v->rank; d++) {
        int64_t i = v->shape[d] == 1 ? 0 : idx[rank - v->rank + d];
        off = off * v->shape[d] + i;
    }
    return off;
}

static void next_index(int rank, const int64_t *shape, int64_t *idx) {
    for (int d = rank - 1; d >= 0; d--) {
        if (++idx[d] < shape[d]) return;
        idx[d] = 0;
    }
}

static bool eval_const(OxNode *n, int nv, OxVal **v, EvalFn f, int outtype) {
    int rank;
    int64_t shape[KILN_MAX_RANK], idx[KILN_MAX_RANK] = {0};
    if (!bcast_shape(n, nv, v, &rank, shape)) return false;
    OxVal *o = set_const(n, 0, outtype, rank, shape);
    if (!o) return nomem(n);
    int64_t m = ox_numel(o);
    for (int64_t i = 0; i < m; i++, next_index(rank, shape, idx)) {
        double a[3] = {0, 0, 0};
        for (int k = 0; k < nv; k++) a[k] = v[k]->c[bcast_offset(v[k], rank, idx)];
        double r = f(a[0], a[1], a[2], v[0]->type);
        o->c[i] = outtype == OT_FLOAT ? (double)(float)r : r;
    }
    return true;
}

static double trunc_int(double r, int type) { return is_int_type(type) ? trunc(r) : r; }
/* An evaluator: a, b, c the operands (unused ones 0), t the type of a. */
#define EVAL(name, expr) \
    static double name(double a, double b, double c, int t) { \
        (void)a, (void)b, (void)c, (void)t; \
        return (expr); \
    }
EVAL(e_add, a + b)
EVAL(e_sub, a - b)
EVAL(e_mul, a * b)
static double e_div(double a, double b, double c, int t) {
    (void)c;
    if (is_int_type(t) && b == 0) return 0;
    return trunc_int(a / b, t);
}
EVAL(e_pow, trunc_int(pow(a, b), t))
EVAL(e_max, a > b || isnan(a) ? a : b)
EVAL(e_min, a < b || isnan(a) ? a : b)
EVAL(e_eq, a == b)
EVAL(e_lt, a < b)
EVAL(e_gt, a > b)
EVAL(e_le, a <= b)
EVAL(e_ge, a >= b)
EVAL(e_where, a != 0 ? b : c)
EVAL(e_copy, a)
EVAL(e_neg, -a)
EVAL(e_abs, fabs(a))
EVAL(e_not, a == 0)
EVAL(e_sqrt, trunc_int(sqrt(a), t))
EVAL(e_floor, floor(a))
EVAL(e_ceil, ceil(a))
EVAL(e_relu, a > 0 ? a : 0)
EVAL(e_exp, exp(a))
EVAL(e_log, log(a))
EVAL(e_recip, 1 / a)

/* ---- elementwise ops ------------------------------------------------------ */

/* name: the ONNX op; kop: kiln's op; f: the constant evaluator (or NULL). */
typedef struct {
    const char *name, *kop;
    EvalFn f;
} Elementwise;

static const Elementwise unary_ops[] = {
    {"Sqrt", "sqrt", e_sqrt},     {"Exp", "exp", e_exp},         {"Log", "log", e_log},
    {"Tanh", "tanh", NULL},       {"Sigmoid", "sigmoid", NULL},  {"Relu", "relu", e_relu},
    {"Erf", "erf", NULL},         {"Abs", "abs", e_abs},         {"Neg", "neg", e_neg},
    {"Reciprocal", "reciprocal", e_recip}, {"Floor", "floor", e_floor}, {"Ceil", "ceil", e_ceil},
    {"Not", "logical_not", e_not}, {"Sin", "sin", NULL},         {"Cos", "cos", NULL},
};

static const Elementwise binary_ops[] = {
    {"Add", "add", e_add},   {"Sub", "sub", e_sub},       {"Mul", "mul", e_mul},
    {"Div", "div", e_div},   {"Pow", "pow", e_pow},       {"Equal", "eq", e_eq},
    {"Less", "lt", e_lt},    {"Greater", "gt", e_gt},     {"LessOrEqual", "le", e_le},
    {"GreaterOrEqual", "ge", e_ge}, {"Max", "maximum", e_max}, {"Min", "minimum", e_min},
    {"Sum", "add", e_add},   {"Mean", "add", e_add},
};

static const Elementwise *find_elementwise(const Elementwise *t, size_t len, const char *name) {
    for (size_t i = 0; i < len; i++)
        if (!strcmp(t[i].name, name)) return &t[i];
    return NULL;
}

static bool is_cmp(const char *kop) {
    return !strcmp(kop, "eq") || !strcmp(kop, "lt") || !strcmp(kop, "gt") || !strcmp(kop, "le") ||
           !strcmp(kop, "ge");
}

/* Integer division truncates toward zero: floor for q >= 0, ceil below. */
static kiln_value trunc_graph(Graph *g, kiln_value q) {
    return kiln_where(g, kiln_binary(g, "lt", q, kiln_scalar(g, 0)), kiln_unary(g, "ceil", q),
                      kiln_unary(g, "floor", q));
}

static bool op_unary(OxNode *n, const Elementwise *e) {
    if (!need_in(n, 0)) return false;
    OxVal *x = in(n, 0);
    int type = x->type;
    if (all_const(n) && e->f) return eval_const(n, 1, &x, e->f, type);
    kiln_value v = kiln_unary(n->im->g, e->kop, gin(n, 0));
    if (is_int_type(type) && !strcmp(e->kop, "sqrt")) v = trunc_graph(n->im->g, v);
    return set_graph(n, 0, v, type);
}

/* Before opset 7, B of a binary op with attribute axis lines up with A's
 * dims from that axis (not from the end): B gets trailing dims of 1. */
static bool legacy_broadcast(OxNode *n) {
    OxVal *a = in(n, 0), *b = in(n, 1);
    const Onnx__AttributeProto *ax = attr(n, "axis");
    if (n->im->opset >= 7 || n->nin != 2 || !a || !b || !ax || !attr_i(n, "broadcast", 0))
        return true;
    int64_t axis = ax->i;
    if (axis < 0) axis += a->rank;
    if (axis < 0 || axis + b->rank > a->rank) return nfail(n, "broadcast axis is out of range");
    OxVal *nb = arena_alloc(&n->im->arena, sizeof *nb);
    if (!nb) return nomem(n);
    *nb = *b;
    nb->rank = a->rank - (int)axis;
    for (int i = b->rank; i < nb->rank; i++) nb->shape[i] = 1;
    if (!b->c) nb->v = kiln_reshape(n->im->g, ox_graph(n, b), nb->rank, nb->shape);
    n->in[1] = nb;
    return nb->v >= 0 || nb->c;
}

/* Binary ops, and the variadic Max, Min, Sum, Mean folded left to right. */
static bool op_binary(OxNode *n, const Elementwise *e) {
    Graph *g = n->im->g;
    if (!need_in(n, 0) || !legacy_broadcast(n)) return false;
    int type = in(n, 0)->type, outtype = is_cmp(e->kop) ? OT_BOOL : type;
    bool mean = !strcmp(e->name, "Mean");
    if (n->nin == 2 && all_const(n) && e->f && in(n, 1))
        return eval_const(n, 2, n->in, e->f, outtype);
    kiln_value acc = gin(n, 0);
    if (n->nin == 1 && !mean) acc = kiln_unary(g, "contiguous", acc);
    for (int k = 1; k < n->nin && acc >= 0; k++) acc = kiln_binary(g, e->kop, acc, gin(n, k));
    if (mean && n->nin > 1) acc = kiln_binary(g, "div", acc, kiln_scalar(g, n->nin));
    if (!strcmp(e->kop, "div") && is_int_type(type)) acc = trunc_graph(g, acc);
    if (!strcmp(e->kop, "pow") && is_int_type(type)) acc = trunc_graph(g, acc);
    return set_graph(n, 0, acc, outtype);
}

static bool op_where(OxNode *n) {
    if (!need_in(n, 0) || !need_in(n, 1) || !need_in(n, 2)) return false;
    int type = in(n, 1)->type;
    if (all_const(n)) return eval_const(n, 3, n->in, e_where, type);
    return set_graph(n, 0, kiln_where(n->im->g, gin(n, 0), gin(n, 1), gin(n, 2)), type);
}

EVAL(e_and, a != 0 && b != 0)
EVAL(e_or, a != 0 || b != 0)
EVAL(e_xor, (a != 0) != (b != 0))

/* And, Or, Xor on bools: where(a, b, a), where(a, a, b), a != b. */
static bool op_logical(OxNode *n) {
    Graph *g = n->im->g;
    const char *op = opname(n);
    if (!need_in(n, 0) || !need_in(n, 1) || !legacy_broadcast(n)) return false;
    EvalFn f = !strcmp(op, "And") ? e_and : !strcmp(op, "Or") ? e_or : e_xor;
    if (all_const(n)) return eval_const(n, 2, n->in, f, OT_BOOL);
    kiln_value a = gin(n, 0), b = gin(n, 1), y;
    if (f == e_and) y = kiln_where(g, a, b, kiln_binary(g, "ne", a, a));
    else if (f == e_or) y = kiln_where(g, a, kiln_binary(g, "eq", a, a), b);
    else y = kiln_binary(g, "ne", a, b);
    return set_graph(n, 0, y, OT_BOOL);
}

static bool op_identity(OxNode *n) {
    OxVal *x = in(n, 0), *o = out_slot(n, 0);
    if (!need_in(n, 0)) return false;
    if (o) {
        const char *name = o->name;
        *o = *x;
        o->name = name;
    }
    return true;
}

/* Dropout in inference is the identity; its mask output is all true. */
static bool op_dropout(OxNode *n) {
    OxVal *t = in(n, 2), *ratio = in(n, 1);
    bool zero = ratio && known(ratio) && ox_numel(ratio) == 1 && known(ratio)[0] == 0;
    if (t && (!known(t) || known(t)[0] != 0) && !zero)   /* training, ratio 0: drops nothing */
        return nfail(n, "unsupported: dropout in training mode (random)");
    if (!op_identity(n)) return false;
    OxVal *x = in(n, 0), *mask = out_slot(n, 1);
    if (!mask) return true;
    OxVal *m = set_const(n, 1, OT_BOOL, x->rank, x->shape);
    if (!m) return nomem(n);
    for (int64_t k = 0; k < ox_numel(m); k++) m->c[k] = 1;
    return true;
}

EVAL(e_cast_int, trunc(a))
EVAL(e_cast_bool, a != 0)

static bool cast_to(OxNode *n, int to) {
    Graph *g = n->im->g;
    OxVal *x = in(n, 0);
    if (!x) return need_in(n, 0);
    if (to != OT_FLOAT && to != OT_BOOL && !is_int_type(to) && !(to == OT_DOUBLE && x->c))
        return nfail(n, "unsupported: cast to %s", ox_type_name(to));
    EvalFn f = to == OT_BOOL ? e_cast_bool : is_int_type(to) ? e_cast_int : e_copy;
    if (x->c) return eval_const(n, 1, &x, f, to);
    kiln_value v = gin(n, 0);
    if (to == OT_BOOL && x->type != OT_BOOL) v = kiln_binary(g, "ne", v, kiln_scalar(g, 0));
    else if (to != OT_BOOL && x->type == OT_BOOL) v = kiln_binary(g, "add", v, kiln_scalar(g, 0));
    else if (is_int_type(to) && !is_int_type(x->type)) v = trunc_graph(g, v);
    return set_graph(n, 0, v, to);
}

static bool op_cast(OxNode *n) { return cast_to(n, (int)attr_i(n, "to", OT_FLOAT)); }
static bool op_cast_like(OxNode *n) { return need_in(n, 1) && cast_to(n, in(n, 1)->type); }

static kiln_value per_channel(Graph *g, kiln_value p, int r);

/* ---- activations (decomposed) --------------------------------------------- */

static bool op_leaky_relu(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value x = gin(n, 0);
    double a = attr_f(n, "alpha", 0.01);
    kiln_value neg = kiln_binary(g, "lt", x, kiln_scalar(g, 0));
    return set_graph(n, 0, kiln_where(g, neg, kiln_binary(g, "mul", x, kiln_scalar(g, a)), x),
                     OT_FLOAT);
}

/* Before opset 7 a 1-D slope holds one value per channel (dim 1). */
static bool op_prelu(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value x = gin(n, 0), slope = gin(n, 1);
    OxVal *sv = in(n, 1);
    if (n->im->opset < 7 && x >= 0 && sv && sv->rank == 1 && kiln_value_rank(g, x) > 2 &&
        sv->shape[0] == kiln_value_shape(g, x)[1] && sv->shape[0] > 1)
        slope = per_channel(g, slope, kiln_value_rank(g, x));
    kiln_value neg = kiln_binary(g, "lt", x, kiln_scalar(g, 0));
    return set_graph(n, 0, kiln_where(g, neg, kiln_binary(g, "mul", x, slope), x), OT_FLOAT);
}

/* alpha * (exp(x) - 1) where x < 0 (<= 0 for Selu), else x; times gamma. */
static kiln_value elu(Graph *g, kiln_value x, double alpha, double gamma, const char *cmp) {
    kiln_value em1 = kiln_binary(g, "sub", kiln_unary(g, "exp", x), kiln_scalar(g, 1));
    kiln_value neg = kiln_binary(g, "mul", em1, kiln_scalar(g, alpha));
    kiln_value y = kiln_where(g, kiln_binary(g, cmp, x, kiln_scalar(g, 0)), neg, x);
    return gamma == 1 ? y : kiln_binary(g, "mul", y, kiln_scalar(g, gamma));
}

static bool op_elu(OxNode *n) {
    return set_graph(n, 0, elu(n->im->g, gin(n, 0), attr_f(n, "alpha", 1.0), 1, "lt"), OT_FLOAT);
}

static bool op_selu(OxNode *n) {
    double a = attr_f(n, "alpha", 1.67326319217681884765625);
    double gm = attr_f(n, "gamma", 1.05070102214813232421875);
    return set_graph(n, 0, elu(n->im->g, gin(n, 0), a, gm, "le"), OT_FLOAT);
}

static kiln_value hard_sigmoid(Graph *g, kiln_value x, double alpha, double beta) {
    kiln_value t = kiln_binary(g, "add", kiln_binary(g, "mul", x, kiln_scalar(g, alpha)),
                               kiln_scalar(g, beta));
    return kiln_clamp(g, t, 1, 0, 1, 1);
}

static bool op_hard_sigmoid(OxNode *n) {
    kiln_value y =
        hard_sigmoid(n->im->g, gin(n, 0), attr_f(n, "alpha", 0.2), attr_f(n, "beta", 0.5));
    return set_graph(n, 0, y, OT_FLOAT);
}

static bool op_hard_swish(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value x = gin(n, 0);
    return set_graph(n, 0, kiln_binary(g, "mul", x, hard_sigmoid(g, x, 1.0 / 6, 0.5)), OT_FLOAT);
}

/* ---- more activations and elementwise math (beyond the list) ---- */

static kiln_value sc(Graph *g, double v) { return kiln_scalar(g, v); }

static bool op_sign(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value x = gin(n, 0);
    kiln_value neg = kiln_where(g, kiln_binary(g, "lt", x, sc(g, 0)), sc(g, -1), sc(g, 0));
    return set_graph(n, 0, kiln_where(g, kiln_binary(g, "gt", x, sc(g, 0)), sc(g, 1), neg),
                     in(n, 0)->type);
}

static bool op_thresholded_relu(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value x = gin(n, 0);
    kiln_value keep = kiln_binary(g, "gt", x, sc(g, attr_f(n, "alpha", 1.0)));
    return set_graph(n, 0, kiln_where(g, keep, x, sc(g, 0)), OT_FLOAT);
}

static bool op_softsign(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value x = gin(n, 0);
    kiln_value d = kiln_binary(g, "add", kiln_unary(g, "abs", x), sc(g, 1));
    return set_graph(n, 0, kiln_binary(g, "div", x, d), OT_FLOAT);
}

/* IsNaN: x != x. IsInf: beyond the largest finite f32, by sign. */
static bool op_isnan(OxNode *n) {
    kiln_value x = gin(n, 0);
    return set_graph(n, 0, kiln_binary(n->im->g, "ne", x, x), OT_BOOL);
}

static bool op_isinf(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value x = gin(n, 0);
    bool pos = attr_i(n, "detect_positive", 1) != 0, neg = attr_i(n, "detect_negative", 1) != 0;
    kiln_value y = pos && neg ? kiln_binary(g, "gt", kiln_unary(g, "abs", x), sc(g, FLT_MAX))
                 : pos ? kiln_binary(g, "gt", x, sc(g, FLT_MAX))
                 : neg ? kiln_binary(g, "lt", x, sc(g, -FLT_MAX))
                       : kiln_binary(g, "lt", x, x);   /* neither: all false */
    return set_graph(n, 0, y, OT_BOOL);
}

static bool op_celu(OxNode *n) {
    Graph *g = n->im->g;
    double a = attr_f(n, "alpha", 1.0);
    kiln_value x = gin(n, 0);
    kiln_value e = kiln_unary(g, "exp", kiln_binary(g, "div", x, sc(g, a)));
    kiln_value neg = kiln_binary(g, "mul", kiln_binary(g, "sub", e, sc(g, 1)), sc(g, a));
    kiln_value y = kiln_binary(g, "add", kiln_binary(g, "maximum", x, sc(g, 0)),
                               kiln_binary(g, "minimum", neg, sc(g, 0)));
    return set_graph(n, 0, y, OT_FLOAT);
}

static bool op_shrink(OxNode *n) {
    Graph *g = n->im->g;
    double l = attr_f(n, "lambd", 0.5), b = attr_f(n, "bias", 0);
    kiln_value x = gin(n, 0);
    kiln_value hi = kiln_where(g, kiln_binary(g, "gt", x, sc(g, l)),
                               kiln_binary(g, "sub", x, sc(g, b)), sc(g, 0));
    kiln_value y = kiln_where(g, kiln_binary(g, "lt", x, sc(g, -l)),
                              kiln_binary(g, "add", x, sc(g, b)), hi);
    return set_graph(n, 0, y, in(n, 0)->type);
}

/* Tan, Sinh, Cosh, Asinh, Acosh, Atanh from sin, cos, exp, log, sqrt. */
static bool op_trig(OxNode *n) {
    Graph *g = n->im->g;
    const char *op = opname(n);
    kiln_value x = gin(n, 0), y;
    kiln_value ep = kiln_unary(g, "exp", x), em = kiln_unary(g, "exp", kiln_unary(g, "neg", x));
    kiln_value xx = kiln_binary(g, "mul", x, x);
    if (!strcmp(op, "Tan"))
        y = kiln_binary(g, "div", kiln_unary(g, "sin", x), kiln_unary(g, "cos", x));
    else if (!strcmp(op, "Sinh"))
        y = kiln_binary(g, "mul", kiln_binary(g, "sub", ep, em), sc(g, 0.5));
    else if (!strcmp(op, "Cosh"))
        y = kiln_binary(g, "mul", kiln_binary(g, "add", ep, em), sc(g, 0.5));
    else if (!strcmp(op, "Asinh"))
        y = kiln_unary(g, "log", kiln_binary(g, "add", x, kiln_unary(g, "sqrt",
                       kiln_binary(g, "add", xx, sc(g, 1)))));
    else if (!strcmp(op, "Acosh"))
        y = kiln_unary(g, "log", kiln_binary(g, "add", x, kiln_unary(g, "sqrt",
                       kiln_binary(g, "sub", xx, sc(g, 1)))));
    else   /* Atanh */
        y = kiln_binary(g, "mul", kiln_unary(g, "log", kiln_binary(g, "div",
                        kiln_binary(g, "add", sc(g, 1), x), kiln_binary(g, "sub", sc(g, 1), x))),
                        sc(g, 0.5));
    return set_graph(n, 0, y, OT_FLOAT);
}

/* Round half to even: floor(x + 0.5), less 1 on a tie that lands odd. */
static bool op_round(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value x = gin(n, 0);
    kiln_value f = kiln_unary(g, "floor", kiln_binary(g, "add", x, sc(g, 0.5)));
    kiln_value tie = kiln_binary(g, "eq", kiln_binary(g, "sub", f, x), sc(g, 0.5));
    kiln_value half = kiln_unary(g, "floor", kiln_binary(g, "mul", f, sc(g, 0.5)));
    kiln_value odd = kiln_binary(g, "ne", kiln_binary(g, "mul", half, sc(g, 2)), f);
    kiln_value both = kiln_where(g, tie, odd, tie);
    return set_graph(n, 0, kiln_where(g, both, kiln_binary(g, "sub", f, sc(g, 1)), f), OT_FLOAT);
}

static bool op_softplus(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value e = kiln_unary(g, "exp", gin(n, 0));
    return set_graph(n, 0, kiln_unary(g, "log", kiln_binary(g, "add", e, kiln_scalar(g, 1))),
                     OT_FLOAT);
}

/* A bound of Clip: constant (has, value) or a graph value (*gv). */
static bool clip_bound(OxNode *n, int k, const char *name, double def, bool *has, double *v,
                       kiln_value *gv) {
    *gv = KILN_NONE;
    if (n->im->opset < 11) {
        *has = attr(n, name) != NULL;
        *v = attr_f(n, name, def);
        return true;
    }
    OxVal *b = in(n, k);
    *has = b != NULL;
    if (b && b->c) *v = b->c[0];
    else if (b) *gv = ox_graph(n, b);
    return !b || b->c || *gv >= 0;
}

static bool op_clip(OxNode *n) {
    Graph *g = n->im->g;
    bool hmin, hmax;
    double lo = 0, hi = 0;
    kiln_value glo, ghi, x = gin(n, 0);
    if (!clip_bound(n, 1, "min", -FLT_MAX, &hmin, &lo, &glo) ||
        !clip_bound(n, 2, "max", FLT_MAX, &hmax, &hi, &ghi))
        return false;
    if (glo >= 0) x = kiln_binary(g, "maximum", x, glo), hmin = false;
    if (ghi >= 0) x = kiln_binary(g, "minimum", x, ghi), hmax = false;
    if (hmin || hmax) x = kiln_clamp(g, x, hmin, lo, hmax, hi);
    return set_graph(n, 0, x, in(n, 0)->type);
}

/* ---- linear algebra and convolution ------------------------------------------ */

static bool op_matmul(OxNode *n) {
    return set_graph(n, 0, kiln_matmul(n->im->g, gin(n, 0), gin(n, 1)), OT_FLOAT);
}

static bool op_gemm(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value a = gin(n, 0), b = gin(n, 1);
    if (attr_i(n, "transA", 0)) a = kiln_transpose(g, a, 0, 1);
    if (attr_i(n, "transB", 0)) b = kiln_transpose(g, b, 0, 1);
    double alpha = attr_f(n, "alpha", 1), beta = attr_f(n, "beta", 1);
    kiln_value y = kiln_matmul(g, a, b);
    if (alpha != 1) y = kiln_binary(g, "mul", y, kiln_scalar(g, alpha));
    if (in(n, 2) && beta != 0) {
        kiln_value c = gin(n, 2);
        if (beta != 1) c = kiln_binary(g, "mul", c, kiln_scalar(g, beta));
        y = kiln_binary(g, "add", y, c);
    }
    return set_graph(n, 0, y, OT_FLOAT);
}

/* Spatial geometry shared by Conv, ConvTranspose and the pools: kernel,
 * strides, dilations and begin/end pads, auto_pad resolved. */
typedef struct {
    int ns;                          /* spatial dims */
    int64_t in[3], k[3], stride[3], dil[3], pb[3], pe[3];
} Geom;

static bool geom_read(OxNode *n, int ns, const int64_t *in_sp, const int64_t *kernel, Geom *gm) {
    int64_t pads[6];
    gm->ns = ns;
    for (int i = 0; i < ns; i++) {
        gm->in[i] = in_sp[i];
        gm->k[i] = kernel[i];
        gm->stride[i] = gm->dil[i] = 1;
        gm->pb[i] = gm->pe[i] = 0;
    }
    int c1 = attr_ints(n, "strides", gm->stride, 3), c2 = attr_ints(n, "dilations", gm->dil, 3);
    int c3 = attr_ints(n, "pads", pads, 6);
    if (c1 < -1 || c2 < -1 || c3 < -1) return false;
    if ((c1 >= 0 && c1 != ns) || (c2 >= 0 && c2 != ns) || (c3 >= 0 && c3 != 2 * ns))
        return nfail(n, "strides, dilations or pads do not match %d spatial dims", ns);
    for (int i = 0; c3 > 0 && i < ns; i++) gm->pb[i] = pads[i], gm->pe[i] = pads[ns + i];
    const int64_t big = (int64_t)1 << 24;   /* keeps every size computation in range */
    for (int i = 0; i < ns; i++)
        if (gm->stride[i] < 1 || gm->stride[i] > big || gm->dil[i] < 1 || gm->dil[i] > big ||
            gm->pb[i] < 0 || gm->pb[i] > big || gm->pe[i] < 0 || gm->pe[i] > big ||
            gm->k[i] < 1 || gm->k[i] > big)
            return nfail(n, "strides and dilations must be 1 to 2^24, pads 0 to 2^24 "
                         "(spatial dim %d)", i);
    return true;
}

/* auto_pad SAME_UPPER / SAME_LOWER: output = ceil(in / stride). */
static void geom_auto_pad(OxNode *n, Geom *gm) {
    bool upper = attr_is(n, "auto_pad", "SAME_UPPER", false);
    bool lower = attr_is(n, "auto_pad", "SAME_LOWER", false);
    if (attr_is(n, "auto_pad", "VALID", false))
        for (int i = 0; i < gm->ns; i++) gm->pb[i] = gm->pe[i] = 0;
    if (!upper && !lower) return;
    for (int i = 0; i < gm->ns; i++) {
        int64_t out = (gm->in[i] + gm->stride[i] - 1) / gm->stride[i];
        int64_t total = (out - 1) * gm->stride[i] + (gm->k[i] - 1) * gm->dil[i] + 1 - gm->in[i];
        if (total < 0) total = 0;
        gm->pb[i] = upper ? total / 2 : total - total / 2;
        gm->pe[i] = total - gm->pb[i];
    }
}

/* x as rank 4 for a 1-D op: (N, C, L) -> (N, C, 1, L). */
static kiln_value to_2d(Graph *g, kiln_value x) {
    if (x < 0) return KILN_NONE;
    const int64_t *s = kiln_value_shape(g, x);
    int64_t shape[4] = {s[0], s[1], 1, s[2]};
    return kiln_reshape(g, x, 4, shape);
}

/* A weight operand reshaped to 2-D spatial: made so directly when it is a
 * constant, so it stays a weight (Conv-BN folding). */
static kiln_value weight_2d(OxNode *n, OxVal *w) {
    if (!w->c || w->v >= 0) return to_2d(n->im->g, ox_graph(n, w));
    OxVal t = *w;
    t.name = NULL;   /* a weight of its own, numbered */
    t.rank = 4;
    t.shape[2] = 1;
    t.shape[3] = w->shape[2];
    return materialize(n, &t);
}

static kiln_value from_2d(Graph *g, kiln_value y) {
    if (y < 0) return KILN_NONE;
    const int64_t *s = kiln_value_shape(g, y);
    int64_t shape[3] = {s[0], s[1], s[3]};
    return kiln_reshape(g, y, 3, shape);
}

/* Pad x's spatial dims by gm's pads (constant 0): asymmetric padding. */
static kiln_value pad_spatial(Graph *g, kiln_value x, const Geom *gm, int rank) {
    int64_t b[KILN_MAX_RANK] = {0}, e[KILN_MAX_RANK] = {0};
    for (int i = 0; i < gm->ns; i++)
        b[rank - gm->ns + i] = gm->pb[i], e[rank - gm->ns + i] = gm->pe[i];
    return kiln_pad(g, x, KILN_PAD_CONSTANT, rank, b, e, 0);
}

static bool conv_geom(OxNode *n, OxVal *x, OxVal *w, Geom *gm) {
    int ns = x->rank - 2;
    if (ns < 1 || ns > 3) return nfail(n, "unsupported: %d-D convolution", ns);
    if (w->rank != x->rank)
        return nfail(n, "the weight has rank %d, the input %d", w->rank, x->rank);
    if (!geom_read(n, ns, x->shape + 2, w->shape + 2, gm)) return false;
    geom_auto_pad(n, gm);
    return true;
}

/* Depth tap kd of a 3-D weight (M, C, KD, KH, KW) as a 2-D one: a weight
 * of its own when w is a constant. */
static kiln_value weight_tap(OxNode *n, OxVal *w, int64_t kd) {
    Graph *g = n->im->g;
    int64_t s4[4] = {w->shape[0], w->shape[1], w->shape[3], w->shape[4]}, hw = s4[2] * s4[3];
    if (!w->c) {
        kiln_value t = kiln_slice(g, ox_graph(n, w), 2, kd, kd + 1, 1);
        return kiln_reshape(g, t, 4, s4);
    }
    OxVal t = {.type = OT_FLOAT, .rank = 4, .v = KILN_NONE};   /* unnamed: numbered */
    memcpy(t.shape, s4, sizeof s4);
    t.c = arena_alloc(&n->im->arena, sizeof(double) * (size_t)(s4[0] * s4[1] * hw));
    if (!t.c) return nomem(n), KILN_NONE;
    for (int64_t mc = 0; mc < s4[0] * s4[1]; mc++)
        memcpy(t.c + mc * hw, w->c + (mc * w->shape[2] + kd) * hw, sizeof(double) * (size_t)hw);
    return materialize(n, &t);
}

/* A 3-D convolution as 2-D ones (kiln's conv is 2-D): output depth od sums
 * conv2d(x[:, :, id], w[:, :, kd]) over the depth taps kd, id = od * stride
 * + kd * dilation - pad (taps in the padding add nothing); the depth
 * slices are concatenated. */
static bool conv3d(OxNode *n, const Geom *gm, kiln_conv_params p) {
    Graph *g = n->im->g;
    OxVal *xv = in(n, 0), *wv = in(n, 1);
    int64_t d = xv->shape[2],
            od_n =
                (d + gm->pb[0] + gm->pe[0] - (gm->dil[0] * (gm->k[0] - 1) + 1)) / gm->stride[0] + 1;
    kiln_value x = gin(n, 0),
               *slices =
                   arena_alloc(&n->im->arena, sizeof(kiln_value) * (size_t)(od_n > 0 ? od_n : 1));
    if (x < 0 || od_n < 1 || !slices)
        return x >= 0 && od_n < 1 ? nfail(n, "the kernel is larger than the input") : false;
    if (gm->pb[1] != gm->pe[1] || gm->pb[2] != gm->pe[2]) {
        int64_t b[5] = {0, 0, 0, gm->pb[1], gm->pb[2]}, e[5] = {0, 0, 0, gm->pe[1], gm->pe[2]};
        x = kiln_pad(g, x, KILN_PAD_CONSTANT, 5, b, e, 0);
        p.padding[0] = p.padding[1] = 0;
    }
    const int64_t *xs = kiln_value_shape(g, x);
    kiln_value *taps = arena_alloc(&n->im->arena, sizeof(kiln_value) * (size_t)gm->k[0]);
    if (!xs || !taps) return xs ? nomem(n) : false;
    for (int64_t kd = 0; kd < gm->k[0]; kd++)
        if ((taps[kd] = weight_tap(n, wv, kd)) < 0) return false;
    int64_t x4[4] = {xs[0], xs[1], xs[3], xs[4]};
    for (int64_t od = 0; od < od_n; od++) {
        kiln_value acc = KILN_NONE;
        for (int64_t kd = 0; kd < gm->k[0]; kd++) {
            int64_t id = od * gm->stride[0] + kd * gm->dil[0] - gm->pb[0];
            if (id < 0 || id >= d) continue;
            kiln_value xi = kiln_reshape(g, kiln_slice(g, x, 2, id, id + 1, 1), 4, x4);
            kiln_value t = kiln_conv2d(g, xi, taps[kd], KILN_NONE, &p);
            acc = acc == KILN_NONE ? t : kiln_binary(g, "add", acc, t);
            if (acc < 0) return false;
        }
        if (acc == KILN_NONE)
            return nfail(n, "unsupported: an output depth slice lies in the padding");
        const int64_t *ys = kiln_value_shape(g, acc);
        int64_t y5[5] = {ys[0], ys[1], 1, ys[2], ys[3]};
        slices[od] = kiln_reshape(g, acc, 5, y5);
    }
    kiln_value y = od_n == 1 ? slices[0] : kiln_concat(g, (int)od_n, slices, 2);
    if (in(n, 2)) {
        int64_t bs[4] = {wv->shape[0], 1, 1, 1};
        y = kiln_binary(g, "add", y, kiln_reshape(g, gin(n, 2), 4, bs));
    }
    return set_graph(n, 0, y, OT_FLOAT);
}

static bool op_conv(OxNode *n) {
    Graph *g = n->im->g;
    Geom gm;
    if (!need_in(n, 0) || !need_in(n, 1) || !conv_geom(n, in(n, 0), in(n, 1), &gm)) return false;
    if (gm.ns == 3) {
        kiln_conv_params p = kiln_conv_defaults();
        p.groups = (int)attr_i(n, "group", 1);
        for (int i = 0; i < 2; i++) {
            p.stride[i] = (int)gm.stride[i + 1];
            p.dilation[i] = (int)gm.dil[i + 1];
            p.padding[i] = (int)gm.pb[i + 1];
        }
        return conv3d(n, &gm, p);
    }
    bool one = gm.ns == 1;
    kiln_value x = one ? to_2d(g, gin(n, 0)) : gin(n, 0);
    kiln_value w = one ? weight_2d(n, in(n, 1)) : gin(n, 1);
    kiln_value b = in(n, 2) ? gin(n, 2) : KILN_NONE;
    kiln_conv_params p = kiln_conv_defaults();
    p.groups = (int)attr_i(n, "group", 1);
    bool sym = true;
    for (int i = 0; i < gm.ns; i++) sym &= gm.pb[i] == gm.pe[i];
    for (int i = 0; i < gm.ns; i++) {
        int d = one ? 1 : i;
        p.stride[d] = (int)gm.stride[i];
        p.dilation[d] = (int)gm.dil[i];
        p.padding[d] = sym ? (int)gm.pb[i] : 0;
    }
    if (!sym && one) {   /* x is (N, C, 1, L) now: pad its last dim */
        Geom g2 = {.ns = 1, .pb = {gm.pb[0]}, .pe = {gm.pe[0]}};
        x = pad_spatial(g, x, &g2, 4);
    } else if (!sym) {
        x = pad_spatial(g, x, &gm, 4);
    }
    kiln_value y = kiln_conv2d(g, x, w, b, &p);
    return set_graph(n, 0, one ? from_2d(g, y) : y, OT_FLOAT);
}

/* A (N, M, OH, OW) tensor of zeros, for a depth slice nothing reaches. */
static kiln_value zeros4(Graph *g, const int64_t *shape) {
    int64_t ones[4] = {1, 1, 1, 1};
    return kiln_expand(g, kiln_reshape(g, kiln_scalar(g, 0), 4, ones), 4, shape);
}

/* A 3-D transposed convolution as 2-D ones: input depth id and kernel tap
 * kd reach output depth od = id * stride + kd * dilation - pad_begin; each
 * output depth slice sums its 2-D transposed convolutions (zeros when none
 * reaches it), and the slices are concatenated. p: the H and W params
 * (symmetric padding; asymmetric is cropped after). */
static bool conv_transpose3d(OxNode *n, const Geom *gm, const int64_t *opad,
                             kiln_conv_transpose_params p) {
    Graph *g = n->im->g;
    OxVal *xv = in(n, 0), *wv = in(n, 1);
    const int64_t *xs = xv->shape;
    int64_t d = xs[2], kd_n = gm->k[0], s = gm->stride[0], dl = gm->dil[0];
    int64_t od_n = s * (d - 1) + opad[0] + dl * (kd_n - 1) + 1 - gm->pb[0] - gm->pe[0];
    int64_t o4[4] = {xs[0], wv->shape[1] * p.groups, 0, 0}, x4[4] = {xs[0], xs[1], xs[3], xs[4]};
    for (int i = 0; i < 2; i++)
        o4[2 + i] = p.stride[i] * (xs[3 + i] - 1) + p.output_padding[i] +
                    p.dilation[i] * (gm->k[1 + i] - 1) + 1 - 2 * p.padding[i];
    kiln_value x = gin(n, 0), *taps = arena_alloc(&n->im->arena, sizeof(kiln_value) * (size_t)kd_n);
    kiln_value *slices =
        arena_alloc(&n->im->arena, sizeof(kiln_value) * (size_t)(od_n > 0 ? od_n : 1));
    if (x < 0 || !taps || !slices) return x < 0 ? false : nomem(n);
    if (od_n < 1 || o4[2] < 1 || o4[3] < 1) return nfail(n, "the output would be empty");
    for (int64_t kd = 0; kd < kd_n; kd++)
        if ((taps[kd] = weight_tap(n, wv, kd)) < 0) return false;
    for (int64_t od = 0; od < od_n; od++) {
        kiln_value acc = KILN_NONE;
        for (int64_t id = 0; id < d; id++)
            for (int64_t kd = 0; kd < kd_n; kd++) {
                if (id * s + kd * dl - gm->pb[0] != od) continue;
                kiln_value xi = kiln_reshape(g, kiln_slice(g, x, 2, id, id + 1, 1), 4, x4);
                kiln_value t = kiln_conv_transpose2d(g, xi, taps[kd], KILN_NONE, &p);
                acc = acc == KILN_NONE ? t : kiln_binary(g, "add", acc, t);
                if (acc < 0) return false;
            }
        if (acc == KILN_NONE) acc = zeros4(g, o4);
        int64_t y5[5] = {o4[0], o4[1], 1, o4[2], o4[3]};
        if ((slices[od] = kiln_reshape(g, acc, 5, y5)) < 0) return false;
    }
    kiln_value y = od_n == 1 ? slices[0] : kiln_concat(g, (int)od_n, slices, 2);
    if (gm->pb[1] != gm->pe[1] || gm->pb[2] != gm->pe[2]) {
        int64_t b[5] = {0, 0, 0, -gm->pb[1], -gm->pb[2]}, e[5] = {0, 0, 0, -gm->pe[1], -gm->pe[2]};
        y = kiln_pad(g, y, KILN_PAD_CONSTANT, 5, b, e, 0);
    }
    if (in(n, 2)) {
        int64_t bs[4] = {o4[1], 1, 1, 1};
        y = kiln_binary(g, "add", y, kiln_reshape(g, gin(n, 2), 4, bs));
    }
    return set_graph(n, 0, y, OT_FLOAT);
}

static bool op_conv_transpose(OxNode *n) {
    Graph *g = n->im->g;
    OxVal *x = in(n, 0), *w = in(n, 1);
    if (!need_in(n, 0) || !need_in(n, 1)) return false;
    int ns = x->rank - 2;
    if (ns < 1 || ns > 3) return nfail(n, "unsupported: %d-D transposed convolution", ns);
    if (w->rank != x->rank)
        return nfail(n, "the weight has rank %d, the input %d", w->rank, x->rank);
    Geom gm;
    int64_t opad[3] = {0, 0, 0}, oshape[3];
    if (!geom_read(n, ns, x->shape + 2, w->shape + 2, &gm)) return false;
    int c1 = attr_ints(n, "output_padding", opad, 3), c2 = attr_ints(n, "output_shape", oshape, 3);
    if (c1 < -1 || c2 < -1) return false;
    for (int i = 0; i < ns; i++)
        if (opad[i] < 0 || opad[i] > (1 << 24) ||
            (c2 == ns && (oshape[i] < 1 || oshape[i] > (1 << 30))))
            return nfail(n, "output_padding or output_shape is out of range");
    bool same =
        attr_is(n, "auto_pad", "SAME_UPPER", false) || attr_is(n, "auto_pad", "SAME_LOWER", false);
    for (int i = 0; i < ns && (c2 == ns || same); i++) {
        /* total padding from the wanted output size (ONNX's formula) */
        int64_t want = c2 == ns ? oshape[i] : x->shape[2 + i] * gm.stride[i];
        int64_t total = gm.stride[i] * (x->shape[2 + i] - 1) + opad[i] +
                        ((gm.k[i] - 1) * gm.dil[i] + 1) - want;
        bool lower = attr_is(n, "auto_pad", "SAME_LOWER", false);
        gm.pb[i] = lower ? (total + 1) / 2 : total / 2;
        gm.pe[i] = total - gm.pb[i];
        if (total < 0) gm.pb[i] = 0, gm.pe[i] = 0, opad[i] += -total;
    }
    bool one = ns == 1;
    kiln_conv_transpose_params p = {{1, 1}, {0, 0}, {0, 0}, {1, 1}, (int)attr_i(n, "group", 1)};
    if (ns == 3) {
        for (int i = 0; i < 2; i++) {
            p.stride[i] = (int)gm.stride[i + 1];
            p.dilation[i] = (int)gm.dil[i + 1];
            p.output_padding[i] = (int)opad[i + 1];
            p.padding[i] = gm.pb[i + 1] == gm.pe[i + 1] ? (int)gm.pb[i + 1] : 0;
        }
        return conv_transpose3d(n, &gm, opad, p);
    }
    bool sym = true;
    for (int i = 0; i < ns; i++) sym &= gm.pb[i] == gm.pe[i];
    for (int i = 0; i < ns; i++) {
        int d = one ? 1 : i;
        p.stride[d] = (int)gm.stride[i];
        p.dilation[d] = (int)gm.dil[i];
        p.output_padding[d] = (int)opad[i];
        p.padding[d] = sym ? (int)gm.pb[i] : 0;
    }
    kiln_value xv = one ? to_2d(g, gin(n, 0)) : gin(n, 0);
    kiln_value wv = one ? weight_2d(n, w) : gin(n, 1);
    kiln_value y = kiln_conv_transpose2d(g, xv, wv, in(n, 2) ? gin(n, 2) : KILN_NONE, &p);
    if (!sym && y >= 0) {
        Geom crop = gm;
        for (int i = 0; i < ns; i++) crop.pb[i] = -gm.pb[i], crop.pe[i] = -gm.pe[i];
        if (one)
            crop.pb[1] = crop.pb[0], crop.pe[1] = crop.pe[0], crop.pb[0] = crop.pe[0] = 0,
            crop.ns = 2;
        y = pad_spatial(g, y, &crop, 4);
    }
    return set_graph(n, 0, one ? from_2d(g, y) : y, OT_FLOAT);
}

/* ---- normalization -------------------------------------------------------- */

static bool only_first_output(OxNode *n) {
    for (size_t k = 1; k < n->n->n_output; k++)
        if (n->n->output[k][0])
            return nfail(n, "unsupported: output %d (training-mode statistics)", (int)k);
    return true;
}

static kiln_value normalize(Graph *g, kiln_value x, int nd, const int *dims, double eps,
                            kiln_value *mean_out, kiln_value *rstd_out);

/* Training mode: normalized with the batch's statistics (over every dim
 * but channels; the variance biased), and the running statistics updated
 * with momentum (outputs 1 and 2). */
static bool batch_norm_training(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value x = gin(n, 0), mean, rstd;
    if (x < 0) return false;
    int r = kiln_value_rank(g, x), dims[KILN_MAX_RANK], nd = 0;
    if (r < 2) return nfail(n, "the input needs rank >= 2");
    for (int i = 0; i < r; i++) if (i != 1) dims[nd++] = i;
    double eps = attr_f(n, "epsilon", 1e-5), mom = attr_f(n, "momentum", 0.9);
    kiln_value y = normalize(g, x, nd, dims, eps, &mean, &rstd);
    y = kiln_binary(g, "mul", y, per_channel(g, gin(n, 1), r));
    y = kiln_binary(g, "add", y, per_channel(g, gin(n, 2), r));
    int64_t c = kiln_value_shape(g, x)[1];
    kiln_value m = kiln_reshape(g, mean, 1, &c);
    kiln_value dx = kiln_binary(g, "sub", x, mean);
    kiln_value var =
        kiln_reshape(g, kiln_reduce(g, "mean", kiln_binary(g, "mul", dx, dx), nd, dims, 0), 1, &c);
    kiln_value rm = kiln_binary(g, "add", kiln_binary(g, "mul", gin(n, 3), kiln_scalar(g, mom)),
                                kiln_binary(g, "mul", m, kiln_scalar(g, 1 - mom)));
    kiln_value rv = kiln_binary(g, "add", kiln_binary(g, "mul", gin(n, 4), kiln_scalar(g, mom)),
                                kiln_binary(g, "mul", var, kiln_scalar(g, 1 - mom)));
    (void)rstd;
    return set_graph(n, 0, y, OT_FLOAT) && set_graph(n, 1, rm, OT_FLOAT) &&
           set_graph(n, 2, rv, OT_FLOAT);
}

static bool op_batch_norm(OxNode *n) {
    if (attr_i(n, "training_mode", 0)) return batch_norm_training(n);
    if (!only_first_output(n)) return false;
    kiln_value y = kiln_batch_norm(n->im->g, gin(n, 0), gin(n, 3), gin(n, 4), gin(n, 1),
                                   gin(n, 2), attr_f(n, "epsilon", 1e-5));
    return set_graph(n, 0, y, OT_FLOAT);
}

/* A per-channel parameter (C) as (C, 1, ..., 1) for a rank-r input. */
static kiln_value per_channel(Graph *g, kiln_value p, int r) {
    if (p < 0) return KILN_NONE;
    int64_t shape[KILN_MAX_RANK];
    shape[0] = kiln_value_shape(g, p)[0];
    for (int i = 1; i < r - 1; i++) shape[i] = 1;
    return kiln_reshape(g, p, r - 1, shape);
}

/* (x - mean) / sqrt(var + eps) over dims; var is the biased variance.
 * mean and rstd (may be NULL) receive the statistics (dims kept). */
static kiln_value normalize(Graph *g, kiln_value x, int nd, const int *dims, double eps,
                            kiln_value *mean_out, kiln_value *rstd_out) {
    kiln_value mean = kiln_reduce(g, "mean", x, nd, dims, 1);
    kiln_value d = kiln_binary(g, "sub", x, mean);
    kiln_value var = kiln_reduce(g, "mean", kiln_binary(g, "mul", d, d), nd, dims, 1);
    kiln_value rstd = kiln_unary(g, "rsqrt", kiln_binary(g, "add", var, kiln_scalar(g, eps)));
    if (mean_out) *mean_out = mean;
    if (rstd_out) *rstd_out = rstd;
    return kiln_binary(g, "mul", d, rstd);
}

/* The spatial dims 2.. of an (N, C, ...) input x into dims; their count,
 * or -1 (with the failure recorded) when x is missing or of rank < 3. */
static int spatial_dims(OxNode *n, kiln_value x, int *dims) {
    if (x < 0) return -1;
    int r = kiln_value_rank(n->im->g, x);
    if (r < 3) return nfail(n, "the input needs rank >= 3, got %d", r), -1;
    for (int i = 2; i < r; i++) dims[i - 2] = i;
    return r - 2;
}

static bool op_instance_norm(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value x = gin(n, 0);
    int dims[KILN_MAX_RANK], ns = spatial_dims(n, x, dims);
    if (ns < 0) return false;
    int r = ns + 2;
    kiln_value y = normalize(g, x, ns, dims, attr_f(n, "epsilon", 1e-5), NULL, NULL);
    y = kiln_binary(g, "mul", y, per_channel(g, gin(n, 1), r));
    y = kiln_binary(g, "add", y, per_channel(g, gin(n, 2), r));
    return set_graph(n, 0, y, OT_FLOAT);
}

/* LayerNormalization; its optional outputs Mean and InvStdDev are the
 * statistics over the normalized dims. */
static bool op_layer_norm(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value x = gin(n, 0), mean, rstd;
    if (x < 0) return false;
    int r = kiln_value_rank(g, x), dims[KILN_MAX_RANK], nd = 0;
    int64_t axis = attr_i(n, "axis", -1);
    if (!norm_axis(n, &axis, r)) return false;
    for (int i = (int)axis; i < r; i++) dims[nd++] = i;
    kiln_value y = normalize(g, x, nd, dims, attr_f(n, "epsilon", 1e-5), &mean, &rstd);
    y = kiln_binary(g, "mul", y, gin(n, 1));
    if (in(n, 2)) y = kiln_binary(g, "add", y, gin(n, 2));
    return set_graph(n, 0, y, OT_FLOAT) && set_graph(n, 1, mean, OT_FLOAT) &&
           set_graph(n, 2, rstd, OT_FLOAT);
}

/* ---- pooling ----------------------------------------------------------------- */

/* A constant (1, 1, OH, OW) or (N, C, 1, 1) of flat input indices. */
static kiln_value index_const(OxNode *n, const int64_t *shape, int64_t a0, int64_t a1,
                              int64_t a2, int64_t a3, int64_t off) {
    OxVal t = {.type = OT_FLOAT, .rank = 4, .v = KILN_NONE};
    int64_t m = shape[0] * shape[1] * shape[2] * shape[3], idx[4] = {0};
    memcpy(t.shape, shape, sizeof(int64_t) * 4);
    if (!(t.c = arena_alloc(&n->im->arena, sizeof(double) * (size_t)m))) return nomem(n), KILN_NONE;
    for (int64_t i = 0; i < m; i++, next_index(4, shape, idx))
        t.c[i] = (double)(idx[0] * a0 + idx[1] * a1 + idx[2] * a2 + idx[3] * a3 + off);
    return materialize(n, &t);
}

/* MaxPool's Indices output (2-D): the flat input index of each window's
 * first maximum. Each kernel tap (kh, kw) is a strided slice of x padded
 * with -FLT_MAX; from the last tap to the first, where it equals the max
 * its index wins. storage_order 1 counts H fastest. */
static bool max_pool_indices(OxNode *n, const Geom *gm, kiln_value y) {
    Graph *g = n->im->g;
    const int64_t *xs = in(n, 0)->shape, *ys = kiln_value_shape(g, y);
    bool col = attr_i(n, "storage_order", 0) != 0;
    int64_t h = xs[2], w = xs[3], oh = ys[2], ow = ys[3], b[4] = {0, 0, gm->pb[0], gm->pb[1]},
            e[4] = {0};
    int64_t sh = col ? 1 : w, sw = col ? h : 1, one[4] = {1, 1, oh, ow},
            nc[4] = {xs[0], xs[1], 1, 1};
    for (int i = 0; i < 2; i++) {
        int64_t need = (gm->k[i] - 1) * gm->dil[i] + (ys[2 + i] - 1) * gm->stride[i] + 1;
        e[2 + i] = need > xs[2 + i] + gm->pb[i] ? need - xs[2 + i] - gm->pb[i] : 0;
    }
    kiln_value xp = kiln_pad(g, gin(n, 0), KILN_PAD_CONSTANT, 4, b, e, -FLT_MAX), idx = KILN_NONE;
    for (int64_t k = gm->k[0] * gm->k[1] - 1; k >= 0 && xp >= 0; k--) {
        int64_t kh = k / gm->k[1] * gm->dil[0], kw = k % gm->k[1] * gm->dil[1];
        kiln_value t = kiln_slice(g, xp, 2, kh, kh + (oh - 1) * gm->stride[0] + 1, gm->stride[0]);
        t = kiln_slice(g, t, 3, kw, kw + (ow - 1) * gm->stride[1] + 1, gm->stride[1]);
        int64_t off = (kh - gm->pb[0]) * sh + (kw - gm->pb[1]) * sw;
        kiln_value ik = index_const(n, one, 0, 0, gm->stride[0] * sh, gm->stride[1] * sw, off);
        idx = kiln_where(g, kiln_binary(g, "eq", t, y), ik, idx < 0 ? kiln_scalar(g, -1) : idx);
    }
    kiln_value base = index_const(n, nc, xs[1] * h * w, h * w, 0, 0, 0);
    return set_graph(n, 1, kiln_binary(g, "add", idx, base), OT_INT64);
}

static bool op_pool(OxNode *n, bool max) {
    OxVal *x = in(n, 0);
    if (!need_in(n, 0)) return false;
    bool indices = max && n->n->n_output > 1 && n->n->output[1][0];
    if (indices && (x->rank != 4 || attr_i(n, "ceil_mode", 0)))
        return nfail(n, "unsupported: MaxPool indices other than 2-D without ceil_mode");
    int ns = x->rank - 2;
    int64_t kernel[3];
    if (ns < 1 || ns > 3) return nfail(n, "the input needs 1 to 3 spatial dims");
    if (attr_ints(n, "kernel_shape", kernel, 3) != ns)
        return nfail(n, "kernel_shape must have %d values", ns);
    Geom gm;
    if (!geom_read(n, ns, x->shape + 2, kernel, &gm)) return false;
    geom_auto_pad(n, &gm);
    kiln_pool_params p = {.nspatial = ns, .ceil_mode = (int)attr_i(n, "ceil_mode", 0),
                          .count_include_pad = (int)attr_i(n, "count_include_pad", 0)};
    for (int i = 0; i < ns; i++) {
        p.kernel[i] = gm.k[i];
        p.stride[i] = gm.stride[i];
        p.dilation[i] = gm.dil[i];
        p.pad_begin[i] = gm.pb[i];
        p.pad_end[i] = gm.pe[i];
    }
    Graph *g = n->im->g;
    kiln_value y = max ? kiln_max_pool(g, gin(n, 0), &p) : kiln_avg_pool(g, gin(n, 0), &p);
    return set_graph(n, 0, y, OT_FLOAT) && (!indices || max_pool_indices(n, &gm, y));
}

static bool op_max_pool(OxNode *n) { return op_pool(n, true); }
static bool op_avg_pool(OxNode *n) { return op_pool(n, false); }

static bool op_global_pool(OxNode *n, const char *red) {
    Graph *g = n->im->g;
    kiln_value x = gin(n, 0);
    int dims[KILN_MAX_RANK], ns = spatial_dims(n, x, dims);
    if (ns < 0) return false;
    return set_graph(n, 0, kiln_reduce(g, red, x, ns, dims, 1), OT_FLOAT);
}

static bool op_global_avg(OxNode *n) { return op_global_pool(n, "mean"); }
static bool op_global_max(OxNode *n) { return op_global_pool(n, "amax"); }

/* ---- shapes and views ------------------------------------------------------- */

/* x with a new shape: a constant stays one (same data), a graph value is a
 * reshape view. */
static bool reshape_to(OxNode *n, int rank, const int64_t *shape) {
    OxVal *x = in(n, 0);
    if (x->c) {
        OxVal *o = set_const(n, 0, x->type, rank, shape);
        if (!o) return nomem(n);
        memcpy(o->c, x->c, sizeof(double) * (size_t)ox_numel(o));
        return true;
    }
    return set_graph(n, 0, kiln_reshape(n->im->g, ox_graph(n, x), rank, shape), x->type);
}

static bool op_reshape(OxNode *n) {
    int64_t s[KILN_MAX_RANK + 1];
    if (!need_in(n, 0)) return false;
    OxVal *x = in(n, 0);
    int r = n->im->opset < 5 ? attr_ints(n, "shape", s, KILN_MAX_RANK)
                             : const_ints(n, 1, s, KILN_MAX_RANK, "shape");
    if (r < 0)
        return r == -1 && n->im->opset < 5 ? nfail(n, "the shape attribute is required") : false;
    int64_t known = 1, neg = -1;
    for (int i = 0; i < r; i++) {
        if (s[i] == 0 && !attr_i(n, "allowzero", 0)) {
            if (i >= x->rank)
                return nfail(n, "shape entry %d is 0 but the input has rank %d", i, x->rank);
            s[i] = x->shape[i];
        }
        if (s[i] < -1 || s[i] > ((int64_t)1 << 40))
            return nfail(n, "shape entry %d is %lld", i, (long long)s[i]);
        if (s[i] > 0 && known > ((int64_t)1 << 40) / s[i])
            return nfail(n, "the shape has too many elements");
        if (s[i] == -1) neg = i;
        else known *= s[i];
    }
    if (neg >= 0) s[neg] = known ? ox_numel(x) / known : 0;
    if (util_numel(r, s) != ox_numel(x))
        return nfail(n, "cannot reshape %lld elements to the shape given", (long long)ox_numel(x));
    return reshape_to(n, r, s);
}

static bool op_flatten(OxNode *n) {
    if (!need_in(n, 0)) return false;
    OxVal *x = in(n, 0);
    int64_t axis = attr_i(n, "axis", 1), s[2] = {1, 1};
    if (axis < 0) axis += x->rank;
    if (axis < 0 || axis > x->rank) return nfail(n, "axis is out of range");
    for (int i = 0; i < x->rank; i++) s[i >= axis] *= x->shape[i];
    return reshape_to(n, 2, s);
}

static bool op_squeeze(OxNode *n) {
    if (!need_in(n, 0)) return false;
    OxVal *x = in(n, 0);
    int64_t axes[KILN_MAX_RANK], s[KILN_MAX_RANK];
    int na = get_axes(n, 13, 1, axes, KILN_MAX_RANK), r = 0;
    bool drop[KILN_MAX_RANK] = {false};
    if (na < -1) return false;
    for (int i = 0; i < na; i++) {
        if (!norm_axis(n, &axes[i], x->rank)) return false;
        if (x->shape[axes[i]] != 1) return nfail(n, "dim %lld is not 1", (long long)axes[i]);
        drop[axes[i]] = true;
    }
    for (int i = 0; i < x->rank; i++)
        if (!(na < 0 ? x->shape[i] == 1 : drop[i])) s[r++] = x->shape[i];
    return reshape_to(n, r, s);
}

static bool op_unsqueeze(OxNode *n) {
    if (!need_in(n, 0)) return false;
    OxVal *x = in(n, 0);
    int64_t axes[KILN_MAX_RANK], s[KILN_MAX_RANK];
    int na = get_axes(n, 13, 1, axes, KILN_MAX_RANK);
    if (na < 0) return na == -1 ? nfail(n, "axes are required") : false;
    int r = x->rank + na;
    if (r > KILN_MAX_RANK) return nfail(n, "unsupported: rank %d above 6", r);
    bool add[KILN_MAX_RANK] = {false};
    for (int i = 0; i < na; i++) {
        if (!norm_axis(n, &axes[i], r)) return false;
        add[axes[i]] = true;
    }
    for (int i = 0, k = 0; i < r; i++) s[i] = add[i] ? 1 : x->shape[k++];
    return reshape_to(n, r, s);
}

static bool op_transpose(OxNode *n) {
    if (!need_in(n, 0)) return false;
    OxVal *x = in(n, 0);
    int64_t perm[KILN_MAX_RANK];
    int np = attr_ints(n, "perm", perm, KILN_MAX_RANK), p[KILN_MAX_RANK];
    if (np < -1) return false;
    for (int i = 0; i < x->rank; i++) p[i] = np < 0 ? x->rank - 1 - i : (int)perm[i];
    if (np >= 0 && np != x->rank) return nfail(n, "perm has %d entries for rank %d", np, x->rank);
    return set_graph(n, 0, kiln_permute(n->im->g, gin(n, 0), x->rank, p), x->type);
}

/* Shape of any value is known at import: every kiln shape is static. */
static bool op_shape(OxNode *n) {
    if (!need_in(n, 0)) return false;
    OxVal *x = in(n, 0);
    int64_t start = attr_i(n, "start", 0), end = attr_i(n, "end", x->rank);
    if (start < 0) start += x->rank;
    if (end < 0) end += x->rank;
    start = start < 0 ? 0 : start > x->rank ? x->rank : start;
    end = end < start ? start : end > x->rank ? x->rank : end;
    int64_t len = end - start;
    OxVal *o = set_const(n, 0, OT_INT64, 1, &len);
    if (!o) return nomem(n);
    for (int64_t i = 0; i < len; i++) o->c[i] = (double)x->shape[start + i];
    return true;
}

static bool op_size(OxNode *n) {
    if (!need_in(n, 0)) return false;
    OxVal *o = set_const(n, 0, OT_INT64, 0, NULL);
    if (!o) return nomem(n);
    o->c[0] = (double)ox_numel(in(n, 0));
    return true;
}

static bool op_constant(OxNode *n) {
    const Onnx__AttributeProto *a = n->n->n_attribute ? n->n->attribute[0] : NULL;
    if (!a || !a->name) return nfail(n, "no value attribute");
    if (!strcmp(a->name, "value") && a->t) {
        OxVal *o = out_slot(n, 0);
        OxVal scratch = {0};
        if (!o) o = &scratch;
        const char *name = o->name;
        bool ok = ox_tensor_const(n->im, a->t, o);
        o->name = name;
        o->v = KILN_NONE;
        return ok;
    }
    bool ints = !strcmp(a->name, "value_int") || !strcmp(a->name, "value_ints");
    bool floats = !strcmp(a->name, "value_float") || !strcmp(a->name, "value_floats");
    if (!ints && !floats) return nfail(n, "unsupported: constant attribute %s", a->name);
    bool scalar = !strcmp(a->name, "value_int") || !strcmp(a->name, "value_float");
    int64_t len = scalar ? 1 : (int64_t)(ints ? a->n_ints : a->n_floats);
    OxVal *o = set_const(n, 0, ints ? OT_INT64 : OT_FLOAT, scalar ? 0 : 1, &len);
    if (!o) return nomem(n);
    for (int64_t i = 0; i < len; i++)
        o->c[i] = scalar ? (ints ? (double)a->i : a->f) : ints ? (double)a->ints[i] : a->floats[i];
    return true;
}

static bool op_constant_of_shape(OxNode *n) {
    int64_t s[KILN_MAX_RANK];
    int r = const_ints(n, 0, s, KILN_MAX_RANK, "shape");
    if (r < 0) return false;
    int64_t m = util_numel(r, s);
    for (int i = 0; i < r; i++) m = s[i] < 0 ? -1 : m;
    if (m < 0 || m > ((int64_t)1 << 31))
        return nfail(n, "the shape has too many elements or a negative dim");
    const Onnx__AttributeProto *a = attr(n, "value");
    OxVal v = {.type = OT_FLOAT};
    double zero = 0;
    v.c = &zero;
    if (a && a->t && !ox_tensor_const(n->im, a->t, &v)) return false;
    if (ox_numel(&v) != 1) return nfail(n, "the value must have one element");
    OxVal *o = set_const(n, 0, v.type, r, s);
    if (!o) return nomem(n);
    for (int64_t i = 0; i < ox_numel(o); i++) o->c[i] = v.c[0];
    return true;
}

static bool op_range(OxNode *n) {
    if (!in(n, 0) || !in(n, 1) || !in(n, 2) || !known(in(n, 0)) || !known(in(n, 1)) ||
        !known(in(n, 2)))
        return nfail(n, "unsupported: start, limit and delta are computed at run time (kiln's "
                     "shapes are static)");
    double st = known(in(n, 0))[0], lim = known(in(n, 1))[0], d = known(in(n, 2))[0];
    double cnt = d == 0 ? 0 : fmax(ceil((lim - st) / d), 0);
    if (!(cnt <= 1 << 30)) return nfail(n, "the range has too many elements");
    int64_t len = (int64_t)cnt;
    OxVal *o = set_const(n, 0, in(n, 0)->type, 1, &len);
    if (!o) return nomem(n);
    for (int64_t i = 0; i < len; i++)
        o->c[i] = in(n, 0)->type == OT_FLOAT ? (float)(st + (double)i * d) : st + (double)i * d;
    return true;
}

/* Concat of constants: copy blocks along the axis. */
static bool concat_const(OxNode *n, int64_t axis) {
    OxVal *x0 = in(n, 0);
    int64_t s[KILN_MAX_RANK], outer = 1, total = 0;
    for (int i = 0; i < x0->rank; i++) s[i] = x0->shape[i];
    for (int k = 0; k < n->nin; k++) total += in(n, k)->shape[axis];
    s[axis] = total;
    for (int i = 0; i < axis; i++) outer *= s[i];
    OxVal *o = set_const(n, 0, x0->type, x0->rank, s);
    if (!o) return nomem(n);
    double *p = o->c;
    for (int64_t b = 0; b < outer; b++)
        for (int k = 0; k < n->nin; k++) {
            int64_t blk = ox_numel(in(n, k)) / (outer ? outer : 1);
            memcpy(p, in(n, k)->c + b * blk, sizeof(double) * (size_t)blk);
            p += blk;
        }
    return true;
}

static bool op_concat(OxNode *n) {
    if (n->nin < 1 || !need_in(n, 0)) return nfail(n, "no inputs");
    int64_t axis = attr_i(n, "axis", n->im->opset < 4 ? 1 : 0);
    if (!norm_axis(n, &axis, in(n, 0)->rank)) return false;
    for (int k = 0; k < n->nin; k++) {
        if (!need_in(n, k)) return false;
        if (in(n, k)->rank != in(n, 0)->rank) return nfail(n, "inputs have different ranks");
    }
    if (all_const(n)) return concat_const(n, axis);
    kiln_value *xs = arena_alloc(&n->im->arena, sizeof(kiln_value) * (size_t)n->nin);
    if (!xs) return nomem(n);
    int m = 0;
    for (int k = 0; k < n->nin; k++)
        if (ox_numel(in(n, k)) > 0 && (xs[m++] = gin(n, k)) < 0) return false;
    kiln_value y = m == 1 ? xs[0] : kiln_concat(n->im->g, m, xs, (int)axis);
    return set_graph(n, 0, y, in(n, 0)->type);
}

/* ONNX Slice bounds (clamped per its rules) -> kiln_slice arguments. */
static bool slice_dim(OxNode *n, kiln_value *x, OxVal *xv, int64_t axis, int64_t st, int64_t en,
                      int64_t step, int64_t *outlen) {
    int64_t d = xv->shape[axis];
    if (step == 0) return nfail(n, "a step is 0");
    if (d == 0) return *outlen = 0, x ? nfail(n, "unsupported: slicing an empty dim") : true;
    if (step > d) step = d;          /* one element either way; keeps -step defined */
    if (step < -d) step = -d;
    if (st < 0) st += d;
    if (en < 0) en += d;
    if (step > 0) {
        st = st < 0 ? 0 : st > d ? d : st;
        en = en < 0 ? 0 : en > d ? d : en;
        *outlen = en > st ? (en - st + step - 1) / step : 0;
    } else {
        st = st < 0 ? 0 : st > d - 1 ? d - 1 : st;
        en = en < -1 ? -1 : en > d - 1 ? d - 1 : en;
        *outlen = st > en ? (st - en + (-step) - 1) / (-step) : 0;
        if (en == -1) en = -d - 1;   /* Python: before the first element */
    }
    if (*outlen == 0 && x)   /* a constant may be empty (shape arithmetic) */
        return nfail(n, "unsupported: the slice of dim %lld is empty", (long long)axis);
    if (x) *x = kiln_slice(n->im->g, *x, (int)axis, st, en, step);
    return true;
}

static bool slice_params(OxNode *n, int64_t *st, int64_t *en, int64_t *ax, int64_t *sp, int *cnt) {
    int rank = in(n, 0)->rank, c;
    if (n->im->opset < 10) {
        c = attr_ints(n, "starts", st, KILN_MAX_RANK);
        if (c < 0 || attr_ints(n, "ends", en, KILN_MAX_RANK) != c)
            return nfail(n, "starts and ends are required");
        if (attr_ints(n, "axes", ax, KILN_MAX_RANK) < 0) for (int i = 0; i < c; i++) ax[i] = i;
        for (int i = 0; i < c; i++) sp[i] = 1;
    } else {
        c = const_ints(n, 1, st, KILN_MAX_RANK, "starts");
        if (c < 0 || const_ints(n, 2, en, KILN_MAX_RANK, "ends") != c)
            return c < 0 ? false : nfail(n, "starts and ends differ in length");
        if (!in(n, 3)) for (int i = 0; i < c; i++) ax[i] = i;
        else if (const_ints(n, 3, ax, KILN_MAX_RANK, "axes") != c) return false;
        if (!in(n, 4)) for (int i = 0; i < c; i++) sp[i] = 1;
        else if (const_ints(n, 4, sp, KILN_MAX_RANK, "steps") != c) return false;
    }
    for (int i = 0; i < c; i++) if (!norm_axis(n, &ax[i], rank)) return false;
    *cnt = c;
    return true;
}

/* Slicing a constant: gather element by element. */
static bool slice_const(OxNode *n, const int64_t *first, const int64_t *step, const int64_t *len) {
    OxVal *x = in(n, 0);
    OxVal *o = set_const(n, 0, x->type, x->rank, len);
    int64_t idx[KILN_MAX_RANK] = {0};
    if (!o) return nomem(n);
    for (int64_t i = 0; i < ox_numel(o); i++, next_index(x->rank, len, idx)) {
        int64_t off = 0;
        for (int d = 0; d < x->rank; d++) off = off * x->shape[d] + first[d] + idx[d] * step[d];
        o->c[i] = x->c[off];
    }
    return true;
}

static bool op_slice(OxNode *n) {
    if (!need_in(n, 0)) return false;
    OxVal *x = in(n, 0);
    int64_t st[KILN_MAX_RANK], en[KILN_MAX_RANK], ax[KILN_MAX_RANK], sp[KILN_MAX_RANK];
    int c;
    if (!slice_params(n, st, en, ax, sp, &c)) return false;
    if (x->c) {
        int64_t first[KILN_MAX_RANK] = {0}, step[KILN_MAX_RANK], len[KILN_MAX_RANK];
        for (int d = 0; d < x->rank; d++) step[d] = 1, len[d] = x->shape[d];
        for (int i = 0; i < c; i++) {
            int64_t a = ax[i], s0 = st[i] < 0 ? st[i] + x->shape[a] : st[i];
            if (!slice_dim(n, NULL, x, a, st[i], en[i], sp[i], &len[a])) return false;
            int64_t d = x->shape[a];
            first[a] = sp[i] > 0 ? (s0 < 0   ? 0
                                    : s0 > d ? d
                                             : s0)
                                 : (s0 < 0       ? 0
                                    : s0 > d - 1 ? d - 1
                                                 : s0);
            step[a] = sp[i];
        }
        return slice_const(n, first, step, len);
    }
    kiln_value v = ox_graph(n, x);
    int64_t len;
    for (int i = 0; i < c && v >= 0; i++)
        if (!slice_dim(n, &v, x, ax[i], st[i], en[i], sp[i], &len)) return false;
    return set_graph(n, 0, v, x->type);
}

static bool op_split(OxNode *n) {
    if (!need_in(n, 0)) return false;
    OxVal *x = in(n, 0);
    int64_t axis = attr_i(n, "axis", 0), sizes[64];
    int nout = (int)n->n->n_output, ns;
    if (!norm_axis(n, &axis, x->rank)) return false;
    if (nout > 64) return nfail(n, "too many outputs");
    bool from_input = n->im->opset >= 13 && in(n, 1);
    ns = n->im->opset < 13 ? attr_ints(n, "split", sizes, 64)
                           : from_input ? const_ints(n, 1, sizes, 64, "split") : -1;
    if (ns < -1 || (from_input && ns < 0)) return false;
    if (nout < 1) return nfail(n, "no outputs");
    for (int k = 0; k < ns; k++)
        if (sizes[k] < 0 || sizes[k] > x->shape[axis])
            return nfail(n, "split size %lld is out of range", (long long)sizes[k]);
    if (ns < 0) {
        int64_t d = x->shape[axis], each = (d + nout - 1) / nout;
        for (int k = 0; k < nout; k++) sizes[k] = k < nout - 1 ? each : d - each * (nout - 1);
    } else if (ns != nout) {
        return nfail(n, "split has %d sizes for %d outputs", ns, nout);
    }
    int64_t at = 0;
    for (int k = 0; k < nout; k++) {
        kiln_value v = ox_graph(n, x);
        int64_t len;
        if (out_slot(n, k) && !slice_dim(n, &v, x, axis, at, at + sizes[k], 1, &len)) return false;
        if (out_slot(n, k) && !set_graph(n, k, v, x->type)) return false;
        at += sizes[k];
    }
    return true;
}

/* Gather of constants: numpy.take on the host. */
static bool gather_const(OxNode *n, int64_t axis) {
    OxVal *x = in(n, 0), *idx = in(n, 1);
    int r = x->rank - 1 + idx->rank;
    int64_t s[KILN_MAX_RANK], outer = 1, inner = 1, m = ox_numel(idx), d = x->shape[axis];
    if (r > KILN_MAX_RANK) return nfail(n, "unsupported: rank above 6");
    for (int i = 0; i < axis; i++) s[i] = x->shape[i], outer *= x->shape[i];
    for (int i = 0; i < idx->rank; i++) s[axis + i] = idx->shape[i];
    for (int i = (int)axis + 1; i < x->rank; i++)
        s[i - 1 + idx->rank] = x->shape[i], inner *= x->shape[i];
    OxVal *o = set_const(n, 0, x->type, r, s);
    if (!o) return nomem(n);
    for (int64_t b = 0; b < outer; b++)
        for (int64_t j = 0; j < m; j++) {
            int64_t k = to_i64(idx->c[j]);
            if (k < 0) k += d;
            if (k < 0 || k >= d)
                return nfail(n, "index %lld is out of range", (long long)idx->c[j]);
            memcpy(o->c + (b * m + j) * inner, x->c + (b * d + k) * inner,
                   sizeof(double) * (size_t)inner);
        }
    return true;
}

static bool op_gather(OxNode *n) {
    if (!need_in(n, 0) || !need_in(n, 1)) return false;
    OxVal *x = in(n, 0), *idx = in(n, 1);
    int64_t axis = attr_i(n, "axis", 0);
    if (!norm_axis(n, &axis, x->rank)) return false;
    if (all_const(n)) return gather_const(n, axis);
    Graph *g = n->im->g;
    if (idx->c && ox_numel(idx) == 1 && idx->rank <= 1) {
        /* one constant index: a slice, then a reshape drops the dim */
        int64_t k = to_i64(idx->c[0]), s[KILN_MAX_RANK], len;
        int r = 0;
        kiln_value v = ox_graph(n, x);
        if (k < -x->shape[axis] || k >= x->shape[axis])
            return nfail(n, "index %lld is out of range", (long long)k);
        if (k < 0) k += x->shape[axis];
        if (!slice_dim(n, &v, x, axis, k, k + 1, 1, &len)) return false;
        for (int i = 0; i < x->rank; i++)
            if (i != axis || idx->rank == 1) s[r++] = i == axis ? 1 : x->shape[i];
        return set_graph(n, 0, kiln_reshape(g, v, r, s), x->type);
    }
    return set_graph(n, 0, kiln_gather(g, ox_graph(n, x), gin(n, 1), (int)axis), x->type);
}

/* Expand: bidirectional broadcasting of x with the shape given. */
static bool op_expand(OxNode *n) {
    if (!need_in(n, 0)) return false;
    OxVal *x = in(n, 0);
    int64_t s[KILN_MAX_RANK], out[KILN_MAX_RANK];
    int r = const_ints(n, 1, s, KILN_MAX_RANK, "shape"), orank;
    if (r < 0) return false;
    OxVal sv = {.rank = r};
    memcpy(sv.shape, s, sizeof s);
    OxVal *pair[2] = {x, &sv};
    if (!bcast_shape(n, 2, pair, &orank, out)) return false;
    if (x->c) {
        OxVal *o = set_const(n, 0, x->type, orank, out);
        int64_t idx[KILN_MAX_RANK] = {0};
        if (!o) return nomem(n);
        for (int64_t i = 0; i < ox_numel(o); i++, next_index(orank, out, idx))
            o->c[i] = x->c[bcast_offset(x, orank, idx)];
        return true;
    }
    Graph *g = n->im->g;
    kiln_value v = ox_graph(n, x);
    if (x->rank < orank) {
        int64_t t[KILN_MAX_RANK];
        for (int i = 0; i < orank; i++)
            t[i] = i < orank - x->rank ? 1 : x->shape[i - (orank - x->rank)];
        v = kiln_reshape(g, v, orank, t);
    }
    return set_graph(n, 0, kiln_expand(g, v, orank, out), x->type);
}

/* Tile one dim at a time: (..., d, ...) viewed as (..., 1, d, ...),
 * expanded to (..., r, d, ...), materialized and merged to (..., r*d, ...);
 * one extra dim at a time keeps within kiln's rank limit. */
static kiln_value tile_dim(Graph *g, kiln_value v, int dim, int64_t rep) {
    int r = kiln_value_rank(g, v);
    int64_t s1[KILN_MAX_RANK], s2[KILN_MAX_RANK], s3[KILN_MAX_RANK];
    const int64_t *xs = kiln_value_shape(g, v);
    for (int i = 0, k = 0; i < r; i++) {
        if (i == dim) { s1[k] = 1; s2[k++] = rep; }
        s1[k] = s2[k] = xs[i];
        k++;
        s3[i] = xs[i] * (i == dim ? rep : 1);
    }
    v = kiln_expand(g, kiln_reshape(g, v, r + 1, s1), r + 1, s2);
    return kiln_reshape(g, kiln_unary(g, "contiguous", v), r, s3);
}

static bool op_tile(OxNode *n) {
    if (!need_in(n, 0)) return false;
    OxVal *x = in(n, 0);
    int64_t rep[KILN_MAX_RANK];
    int r = const_ints(n, 1, rep, KILN_MAX_RANK, "repeats");
    if (r < 0) return false;
    if (r != x->rank) return nfail(n, "repeats has %d values for rank %d", r, x->rank);
    Graph *g = n->im->g;
    kiln_value v = ox_graph(n, x);
    for (int i = 0; i < r && v >= 0; i++) {
        if (rep[i] < 1)
            return nfail(n, "unsupported: repeats %lld (kiln tensors are non-empty)",
                         (long long)rep[i]);
        if (rep[i] == 1) continue;
        if (rep[i] > ((int64_t)1 << 40) / x->shape[i])
            return nfail(n, "repeats %lld is too large", (long long)rep[i]);
        if (r == KILN_MAX_RANK) return nfail(n, "unsupported: tiling a rank-6 tensor");
        v = tile_dim(g, v, i, rep[i]);
    }
    return set_graph(n, 0, v, x->type);
}

/* Constant padding with a value known at run time only: pad with 0, and
 * pick the value where a padded all-ones mask is 0. */
static bool pad_runtime_value(OxNode *n, const int64_t *pads, int np) {
    Graph *g = n->im->g;
    OxVal *x = in(n, 0);
    if (np != 2 * x->rank) return nfail(n, "pads has %d values for rank %d", np, x->rank);
    for (int i = 0; i < np; i++)
        if (pads[i] < -((int64_t)1 << 30) || pads[i] > ((int64_t)1 << 30))
            return nfail(n, "pad %lld is out of range", (long long)pads[i]);
    if (!attr_is(n, "mode", "constant", true))
        return nfail(n, "unsupported: pad mode with a value");
    kiln_value y = kiln_pad(g, ox_graph(n, x), KILN_PAD_CONSTANT, x->rank, pads, pads + x->rank, 0);
    kiln_value ones = kiln_expand(g, kiln_reshape(g, kiln_scalar(g, 1), x->rank,
                                  (int64_t[KILN_MAX_RANK]){1, 1, 1, 1, 1, 1}), x->rank, x->shape);
    kiln_value mask = kiln_pad(g, ones, KILN_PAD_CONSTANT, x->rank, pads, pads + x->rank, 0);
    kiln_value inside = kiln_binary(g, "ne", mask, kiln_scalar(g, 0));
    return set_graph(n, 0, kiln_where(g, inside, y, gin(n, 2)), x->type);
}

static bool op_pad(OxNode *n) {
    if (!need_in(n, 0)) return false;
    OxVal *x = in(n, 0);
    int64_t pads[2 * KILN_MAX_RANK];
    double value = 0;
    int np;
    if (n->im->opset < 11) {
        np = attr_ints(n, n->im->opset < 2 ? "paddings" : "pads", pads, 2 * KILN_MAX_RANK);
        value = attr_f(n, "value", 0);
    } else {
        np = const_ints(n, 1, pads, 2 * KILN_MAX_RANK, "pads");
        OxVal *cv = in(n, 2);
        if (cv && !cv->c) return pad_runtime_value(n, pads, np);
        if (cv && ox_numel(cv)) value = cv->c[0];
    }
    if (np < 0) return np == -1 ? nfail(n, "pads are required") : false;
    if (np != 2 * x->rank) return nfail(n, "pads has %d values for rank %d", np, x->rank);
    for (int i = 0; i < np; i++)
        if (pads[i] < -((int64_t)1 << 30) || pads[i] > ((int64_t)1 << 30))
            return nfail(n, "pad %lld is out of range", (long long)pads[i]);
    kiln_pad_mode mode = attr_is(n, "mode", "edge", false)      ? KILN_PAD_EDGE
                         : attr_is(n, "mode", "reflect", false) ? KILN_PAD_REFLECT
                                                                : KILN_PAD_CONSTANT;
    if (!attr_is(n, "mode", "constant", true) && mode == KILN_PAD_CONSTANT)
        return nfail(n, "unsupported: pad mode");
    kiln_value y = kiln_pad(n->im->g, ox_graph(n, x), mode, x->rank, pads, pads + x->rank, value);
    return set_graph(n, 0, y, x->type);
}

/* x reshaped to s1, permuted, materialized, reshaped to s2. */
static kiln_value shuffle(Graph *g, kiln_value x, int r1, const int64_t *s1, const int *perm,
                          int r2, const int64_t *s2) {
    kiln_value v = kiln_permute(g, kiln_reshape(g, x, r1, s1), r1, perm);
    return kiln_reshape(g, kiln_unary(g, "contiguous", v), r2, s2);
}

/* DepthToSpace (DCR or CRD) and SpaceToDepth: reshape, permute, reshape. */
static bool op_depth_space(OxNode *n) {
    Graph *g = n->im->g;
    OxVal *xv = in(n, 0);
    int64_t b = attr_i(n, "blocksize", 0), *x = xv->shape;
    if (xv->rank != 4 || b < 1 || b > 4096)
        return nfail(n, "needs a rank-4 input and blocksize 1 to 4096");
    kiln_value v = gin(n, 0), y;
    if (!strcmp(opname(n), "SpaceToDepth")) {
        if (x[2] % b || x[3] % b) return nfail(n, "H and W must be multiples of blocksize");
        int64_t s1[6] = {x[0], x[1], x[2] / b, b, x[3] / b, b};
        int64_t s2[4] = {x[0], x[1] * b * b, x[2] / b, x[3] / b};
        y = shuffle(g, v, 6, s1, (int[]){0, 3, 5, 1, 2, 4}, 4, s2);
    } else {
        if (x[1] % (b * b)) return nfail(n, "C must be a multiple of blocksize^2");
        bool crd = attr_is(n, "mode", "CRD", false);
        int64_t c = x[1] / (b * b), s2[4] = {x[0], c, x[2] * b, x[3] * b};
        int64_t dcr[6] = {x[0], b, b, c, x[2], x[3]}, crd6[6] = {x[0], c, b, b, x[2], x[3]};
        y = crd ? shuffle(g, v, 6, crd6, (int[]){0, 1, 4, 2, 5, 3}, 4, s2)
                : shuffle(g, v, 6, dcr, (int[]){0, 3, 4, 1, 5, 2}, 4, s2);
    }
    return set_graph(n, 0, y, xv->type);
}

/* Trilu: x where j - i >= k (upper) or <= k (lower), else 0; the mask a
 * constant over the last two dims. */
static bool op_trilu(OxNode *n) {
    OxVal *xv = in(n, 0);
    int64_t k = 0;
    if (xv->rank < 2) return nfail(n, "needs rank >= 2");
    if (in(n, 1) && const_ints(n, 1, &k, 1, "k") < 0) return false;
    bool upper = attr_i(n, "upper", 1) != 0;
    int64_t h = xv->shape[xv->rank - 2], w = xv->shape[xv->rank - 1];
    OxVal m = {.type = OT_BOOL, .rank = 2, .shape = {h, w}, .v = KILN_NONE};
    if (!(m.c = arena_alloc(&n->im->arena, sizeof(double) * (size_t)(h * w)))) return nomem(n);
    for (int64_t i = 0; i < h; i++)
        for (int64_t j = 0; j < w; j++) m.c[i * w + j] = upper ? j - i >= k : j - i <= k;
    Graph *g = n->im->g;
    kiln_value y = kiln_where(g, materialize(n, &m), gin(n, 0), sc(g, 0));
    return set_graph(n, 0, y, xv->type);
}

/* MeanVarianceNormalization: (x - mean) / sqrt(var) over axes (default
 * 0, 2, 3), with ONNX's epsilon of 1e-9. */
static bool op_mvn(OxNode *n) {
    int64_t axes[KILN_MAX_RANK] = {0, 2, 3};
    int na = attr_ints(n, "axes", axes, KILN_MAX_RANK), dims[KILN_MAX_RANK];
    if (na < -1) return false;
    if (na < 0) na = 3;
    for (int i = 0; i < na; i++) {
        if (!norm_axis(n, &axes[i], in(n, 0)->rank)) return false;
        dims[i] = (int)axes[i];
    }
    kiln_value y = normalize(n->im->g, gin(n, 0), na, dims, 1e-9, NULL, NULL);
    return set_graph(n, 0, y, OT_FLOAT);
}

/* ---- softmax, reductions, argmax ----------------------------------------- */

/* Softmax before opset 13 flattens to 2-D at axis (default 1); from 13 it is
 * over the one axis (default -1). */
static bool op_softmax_like(OxNode *n, bool log) {
    Graph *g = n->im->g;
    kiln_value x = gin(n, 0);
    if (x < 0) return false;
    int r = kiln_value_rank(g, x);
    bool old = n->im->opset < 13;
    int64_t axis = attr_i(n, "axis", old ? 1 : -1);
    if (!norm_axis(n, &axis, r)) return false;
    if (!old || axis == r - 1) {
        kiln_value y = log ? kiln_log_softmax(g, x, (int)axis) : kiln_softmax(g, x, (int)axis);
        return set_graph(n, 0, y, OT_FLOAT);
    }
    int64_t s[2] = {1, 1};
    const int64_t *xs = kiln_value_shape(g, x);
    int64_t keep[KILN_MAX_RANK];
    memcpy(keep, xs, sizeof(int64_t) * (size_t)r);
    for (int i = 0; i < r; i++) s[i >= axis] *= xs[i];
    kiln_value f = kiln_reshape(g, x, 2, s);
    f = log ? kiln_log_softmax(g, f, 1) : kiln_softmax(g, f, 1);
    return set_graph(n, 0, kiln_reshape(g, f, r, keep), OT_FLOAT);
}

static bool op_softmax(OxNode *n) { return op_softmax_like(n, false); }
static bool op_log_softmax(OxNode *n) { return op_softmax_like(n, true); }

/* Reduce over the axes of the node (attribute, or input 1 for ReduceSum
 * from opset 13); none: every dim, unless noop_with_empty_axes. */
static bool reduce_axes(OxNode *n, int rank, int *dims, int *nd, bool *noop) {
    int64_t axes[KILN_MAX_RANK];
    bool input = n->im->opset >= 13 && !strcmp(opname(n), "ReduceSum");
    int na = input ? (in(n, 1) ? const_ints(n, 1, axes, KILN_MAX_RANK, "axes") : -1)
                   : attr_ints(n, "axes", axes, KILN_MAX_RANK);
    if (na < -1) return false;
    *noop = na <= 0 && attr_i(n, "noop_with_empty_axes", 0);
    *nd = 0;
    for (int i = 0; i < na; i++) {
        if (!norm_axis(n, &axes[i], rank)) return false;
        dims[(*nd)++] = (int)axes[i];
    }
    if (*nd == 0) for (int i = 0; i < rank; i++) dims[(*nd)++] = i;
    return true;
}

static bool op_reduce(OxNode *n) {
    Graph *g = n->im->g;
    const char *op = opname(n) + 6;   /* after "Reduce" */
    kiln_value x = gin(n, 0);
    if (x < 0) return false;
    int dims[KILN_MAX_RANK], nd;
    bool noop, keep = attr_i(n, "keepdims", 1) != 0;
    if (!reduce_axes(n, kiln_value_rank(g, x), dims, &nd, &noop)) return false;
    if (noop) return set_graph(n, 0, x, in(n, 0)->type);
    if (kiln_value_rank(g, x) == 0) return set_graph(n, 0, x, in(n, 0)->type);
    kiln_value y;
    if (!strcmp(op, "Sum")) y = kiln_reduce(g, "sum", x, nd, dims, keep);
    else if (!strcmp(op, "Mean")) y = kiln_reduce(g, "mean", x, nd, dims, keep);
    else if (!strcmp(op, "Max")) y = kiln_reduce(g, "amax", x, nd, dims, keep);
    else if (!strcmp(op, "Min")) y = kiln_reduce(g, "amin", x, nd, dims, keep);
    else if (!strcmp(op, "Prod")) y = kiln_reduce(g, "prod", x, nd, dims, keep);
    else if (!strcmp(op, "SumSquare") || !strcmp(op, "L2"))
        y = kiln_reduce(g, "sum", kiln_binary(g, "mul", x, x), nd, dims, keep);
    else if (!strcmp(op, "L1")) y = kiln_reduce(g, "sum", kiln_unary(g, "abs", x), nd, dims, keep);
    else if (!strcmp(op, "LogSum"))
        y = kiln_unary(g, "log", kiln_reduce(g, "sum", x, nd, dims, keep));
    else {   /* LogSumExp, shifted by the max for range */
        kiln_value m = kiln_reduce(g, "amax", x, nd, dims, 1);
        kiln_value e = kiln_unary(g, "exp", kiln_binary(g, "sub", x, m));
        y = kiln_binary(g, "add", kiln_unary(g, "log", kiln_reduce(g, "sum", e, nd, dims, 1)), m);
        if (!keep) {
            int64_t s[KILN_MAX_RANK];
            int r = 0;
            const int64_t *ys = kiln_value_shape(g, x);
            for (int i = 0; i < kiln_value_rank(g, x); i++) {
                bool red = false;
                for (int k = 0; k < nd; k++) red |= dims[k] == i;
                if (!red) s[r++] = ys[i];
            }
            y = kiln_reshape(g, y, r, s);
        }
    }
    if (!strcmp(op, "L2")) y = kiln_unary(g, "sqrt", y);
    return set_graph(n, 0, y, in(n, 0)->type);
}

/* ArgMax/ArgMin = the first (or last) index where x equals its extreme:
 * amin (amax) over where(x == m, iota, BIG (-1)), iota a constant. */
/* 0, 1, ..., d-1 along dim ax of a rank-r value (size 1 elsewhere): a
 * constant weight. */
static kiln_value iota_along(OxNode *n, int r, int ax, int64_t d) {
    OxVal iota = {.type = OT_FLOAT, .rank = r, .v = KILN_NONE};
    for (int i = 0; i < r; i++) iota.shape[i] = i == ax ? d : 1;
    if (!(iota.c = arena_alloc(&n->im->arena, sizeof(double) * (size_t)d))) return nomem(n), -1;
    for (int64_t i = 0; i < d; i++) iota.c[i] = (double)i;
    return materialize(n, &iota);
}

/* The index of the first (or last) extreme of x along ax, dims kept. */
static kiln_value arg_extreme(OxNode *n, kiln_value x, int ax, bool max, bool last, bool keep) {
    Graph *g = n->im->g;
    int r = kiln_value_rank(g, x);
    kiln_value iota = iota_along(n, r, ax, kiln_value_shape(g, x)[ax]);
    kiln_value m = kiln_reduce(g, max ? "amax" : "amin", x, 1, &ax, 1);
    kiln_value hit = kiln_binary(g, "eq", x, m);
    kiln_value idx = kiln_where(g, hit, iota, kiln_scalar(g, last ? -1 : 1e9));
    return kiln_reduce(g, last ? "amax" : "amin", idx, 1, &ax, keep);
}

static bool op_arg(OxNode *n, bool max) {
    Graph *g = n->im->g;
    kiln_value x = gin(n, 0);
    if (x < 0) return false;
    int64_t axis = attr_i(n, "axis", 0);
    if (!norm_axis(n, &axis, kiln_value_rank(g, x))) return false;
    bool last = attr_i(n, "select_last_index", 0) != 0, keep = attr_i(n, "keepdims", 1) != 0;
    return set_graph(n, 0, arg_extreme(n, x, (int)axis, max, last, keep), OT_INT64);
}

/* Hardmax: 1 at the first maximum along axis, else 0; before opset 13
 * over the 2-D coercion at axis, as Softmax. */
static bool op_hardmax(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value x = gin(n, 0);
    if (x < 0) return false;
    int r = kiln_value_rank(g, x);
    bool old = n->im->opset < 13;
    int64_t axis = attr_i(n, "axis", old ? 1 : -1), s[2] = {1, 1}, keep[KILN_MAX_RANK];
    if (!norm_axis(n, &axis, r)) return false;
    memcpy(keep, kiln_value_shape(g, x), sizeof(int64_t) * (size_t)r);
    int ax = (int)axis;
    if (old) {
        for (int i = 0; i < r; i++) s[i >= axis] *= keep[i];
        x = kiln_reshape(g, x, 2, s);
        ax = 1;
    }
    int rr = old ? 2 : r;
    kiln_value first = arg_extreme(n, x, ax, true, false, true);
    kiln_value at = kiln_binary(g, "eq", iota_along(n, rr, ax, kiln_value_shape(g, x)[ax]), first);
    kiln_value y = kiln_where(g, at, kiln_scalar(g, 1), kiln_scalar(g, 0));
    if (old) y = kiln_reshape(g, y, r, keep);
    return set_graph(n, 0, y, OT_FLOAT);
}

static bool op_argmax(OxNode *n) { return op_arg(n, true); }
static bool op_argmin(OxNode *n) { return op_arg(n, false); }

/* ---- the op table ---------------------------------------------------------- */

typedef struct {
    const char *name;
    bool (*fn)(OxNode *);
} OpHandler;

static const OpHandler handlers[] = {
    {"Where", op_where}, {"Identity", op_identity}, {"And", op_logical}, {"Or", op_logical},
    {"Xor", op_logical}, {"Dropout", op_dropout},
    {"Cast", op_cast}, {"CastLike", op_cast_like}, {"LeakyRelu", op_leaky_relu},
    {"PRelu", op_prelu}, {"Elu", op_elu}, {"Selu", op_selu}, {"HardSigmoid", op_hard_sigmoid},
    {"HardSwish", op_hard_swish}, {"Softplus", op_softplus}, {"Clip", op_clip},
    {"Sign", op_sign}, {"ThresholdedRelu", op_thresholded_relu}, {"Softsign", op_softsign},
    {"IsNaN", op_isnan}, {"IsInf", op_isinf}, {"Celu", op_celu}, {"Shrink", op_shrink},
    {"Tan", op_trig}, {"Sinh", op_trig}, {"Cosh", op_trig}, {"Asinh", op_trig},
    {"Acosh", op_trig}, {"Atanh", op_trig}, {"Round", op_round},
    {"MatMul", op_matmul}, {"Gemm", op_gemm}, {"Conv", op_conv},
    {"ConvTranspose", op_conv_transpose}, {"BatchNormalization", op_batch_norm},
    {"InstanceNormalization", op_instance_norm}, {"LayerNormalization", op_layer_norm},
    {"MaxPool", op_max_pool}, {"AveragePool", op_avg_pool},
    {"GlobalAveragePool", op_global_avg}, {"GlobalMaxPool", op_global_max},
    {"Reshape", op_reshape}, {"Flatten", op_flatten}, {"Squeeze", op_squeeze},
    {"Unsqueeze", op_unsqueeze}, {"Transpose", op_transpose}, {"Shape", op_shape},
    {"Size", op_size}, {"Constant", op_constant}, {"ConstantOfShape", op_constant_of_shape},
    {"Range", op_range}, {"Concat", op_concat}, {"Slice", op_slice}, {"Split", op_split},
    {"Gather", op_gather}, {"Expand", op_expand}, {"Tile", op_tile}, {"Pad", op_pad},
    {"Softmax", op_softmax}, {"LogSoftmax", op_log_softmax},
    {"ReduceSum", op_reduce}, {"ReduceMean", op_reduce}, {"ReduceMax", op_reduce},
    {"ReduceMin", op_reduce}, {"ReduceProd", op_reduce}, {"ReduceL2", op_reduce},
    {"ReduceL1", op_reduce}, {"ReduceSumSquare", op_reduce}, {"ReduceLogSum", op_reduce},
    {"ReduceLogSumExp", op_reduce}, {"ArgMax", op_argmax}, {"ArgMin", op_argmin},
    {"Hardmax", op_hardmax}, {"DepthToSpace", op_depth_space}, {"SpaceToDepth", op_depth_space},
    {"Trilu", op_trilu}, {"MeanVarianceNormalization", op_mvn},
};

#define LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Every op but Constant reads input 0: checked once here. */
bool ox_convert(OxNode *n) {
    const char *op = opname(n) ? opname(n) : "";
    const char *dom = n->n->domain ? n->n->domain : "";
    const Elementwise *u = find_elementwise(unary_ops, LEN(unary_ops), op);
    const Elementwise *b = find_elementwise(binary_ops, LEN(binary_ops), op);
    const OpHandler *h = NULL;
    for (size_t i = 0; i < LEN(handlers) && !h; i++)
        if (!strcmp(handlers[i].name, op)) h = &handlers[i];
    if (*dom && strcmp(dom, "ai.onnx"))
        return nfail(n, "unsupported op %s.%s (opset %d) at node %d", dom, op, n->im->opset,
                     n->index);
    if (!u && !b && !h)
        return nfail(n, "unsupported op %s (opset %d) at node %d", op, n->im->opset, n->index);
    if (strcmp(op, "Constant") && !in(n, 0)) return nfail(n, "input 0 is required");
    return u ? op_unary(n, u) : b ? op_binary(n, b) : h->fn(n);
}
