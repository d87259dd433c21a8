/*
 * onnx_elementwise.c -- elementwise ONNX ops and activations: the unary and binary
 * tables (a kiln op and a constant evaluator each), and the activations
 * kiln decomposes (LeakyRelu = where(x < 0, a*x, x), Elu, Selu, HardSwish,
 * Softplus, Clip, ...).
 */
#include "front/front.h"
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- constant evaluators ------------------------------------------------- */

static double trunc_int(double r, int type) { return ox_is_int_type(type) ? trunc(r) : r; }
/* An evaluator: a, b, c the operands (unused ones 0), t the type of a. */
#define EVAL(name, expr)                                      \
    static double name(double a, double b, double c, int t) { \
        (void)a, (void)b, (void)c, (void)t;                   \
        return (expr);                                        \
    }
EVAL(e_add, a + b)
EVAL(e_sub, a - b)
EVAL(e_mul, a *b)
double ox_e_div(double a, double b, double c, int t) {
    (void)c;
    if (ox_is_int_type(t) && b == 0) return 0;
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
    {"Sqrt", "sqrt", e_sqrt},      {"Exp", "exp", e_exp},
    {"Log", "log", e_log},         {"Tanh", "tanh", NULL},
    {"Sigmoid", "sigmoid", NULL},  {"Relu", "relu", e_relu},
    {"Erf", "erf", NULL},          {"Abs", "abs", e_abs},
    {"Neg", "neg", e_neg},         {"Reciprocal", "reciprocal", e_recip},
    {"Floor", "floor", e_floor},   {"Ceil", "ceil", e_ceil},
    {"Not", "logical_not", e_not}, {"Sin", "sin", NULL},
    {"Cos", "cos", NULL},
};

static const Elementwise binary_ops[] = {
    {"Add", "add", e_add},          {"Sub", "sub", e_sub},     {"Mul", "mul", e_mul},
    {"Div", "div", ox_e_div},       {"Pow", "pow", e_pow},     {"Equal", "eq", e_eq},
    {"Less", "lt", e_lt},           {"Greater", "gt", e_gt},   {"LessOrEqual", "le", e_le},
    {"GreaterOrEqual", "ge", e_ge}, {"Max", "maximum", e_max}, {"Min", "minimum", e_min},
    {"Sum", "add", e_add},          {"Mean", "add", e_add},
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
    if (!ox_need_in(n, 0)) return false;
    OxVal *x = ox_in(n, 0);
    int type = x->type;
    if (ox_all_const(n) && e->f) return ox_eval_const(n, 1, &x, e->f, type);
    kiln_value v = kiln_unary(n->im->g, e->kop, ox_gin(n, 0));
    if (ox_is_int_type(type) && !strcmp(e->kop, "sqrt")) v = trunc_graph(n->im->g, v);
    if (!strcmp(e->kop, "neg") || !strcmp(e->kop, "abs")) v = ox_wrap_graph(n->im->g, v, type);
    if (!ox_set_graph(n, 0, v, type)) return false;
    ox_spec_eval(n, 1, &x, e->f, type);
    return true;
}

/* Before opset 7, B of a binary op with attribute axis lines up with A's
 * dims from that axis (not from the end): B gets trailing dims of 1. */
static bool legacy_broadcast(OxNode *n) {
    OxVal *a = ox_in(n, 0), *b = ox_in(n, 1);
    const Onnx__AttributeProto *ax = ox_attr(n, "axis");
    if (n->im->opset >= 7 || n->nin != 2 || !a || !b || !ax || !ox_attr_i(n, "broadcast", 0))
        return true;
    int64_t axis = ax->i;
    if (axis < 0) axis += a->rank;
    if (axis < 0 || axis + b->rank > a->rank) return ox_nfail(n, "broadcast axis is out of range");
    OxVal *nb = arena_alloc(&n->im->arena, sizeof *nb);
    if (!nb) return ox_nomem(n);
    *nb = *b;
    nb->rank = a->rank - (int)axis;
    for (int i = b->rank; i < nb->rank; i++) nb->shape[i] = 1;
    if (!b->c) nb->v = kiln_reshape(n->im->g, ox_graph(n, b), nb->rank, nb->shape);
    n->in[1] = nb;
    return nb->v >= 0 || nb->c;
}

/* a * b wrapped to a 16- or 32-bit type, exact: b = h bh + bl with bl in
 * [0, h), h = 256 for 16 bits (a bl and a bh stay below 2^24, f32's exact
 * integers, and h (a bh mod h) + a bl too) and 65536 for 32 bits (below
 * 2^48, in f64); then the sum wrapped. */
static kiln_value mul_wrapped(Graph *g, kiln_value a, kiln_value b, int type) {
    bool w32 = type == OT_INT32 || type == OT_UINT32;
    int half = w32 ? OT_UINT16 : OT_UINT8;
    double h = w32 ? 65536 : 256;
    kiln_value bl = ox_wrap_graph(g, b, half);
    kiln_value bh = kiln_binary(g, "mul", kiln_binary(g, "sub", b, bl), ox_sc(g, 1.0 / h));
    kiln_value hi = ox_wrap_graph(g, kiln_binary(g, "mul", a, bh), half);
    kiln_value s =
        kiln_binary(g, "add", kiln_binary(g, "mul", hi, ox_sc(g, h)), kiln_binary(g, "mul", a, bl));
    return ox_wrap_graph(g, s, type);
}

/* An operand of int32/int64 arithmetic in f64 (exact to 2^53; an f32 one
 * holds small values only, and their products or sums would round). */
static kiln_value wide_operand(OxNode *n, int k, int type) {
    kiln_value v = ox_gin(n, k);
    return ox_is_wide_int(type) && v >= 0 ? kiln_cast(n->im->g, v, KILN_F64) : v;
}

/* Binary ops, and the variadic Max, Min, Sum, Mean folded left to right;
 * Add, Sub, Mul, Pow and Sum of 8-, 16- and 32-bit integers wrap. */
/* An integer x + c, c + x or x - c with c a known scalar: the result is
 * affine in x's base (ox_slice_runtime reads it). */
static void note_affine(OxNode *n, const Elementwise *e) {
    OxVal *x = ox_in(n, 0), *y = ox_in(n, 1), *o = ox_out_slot(n, 0);
    bool add = !strcmp(e->name, "Add"), sub = !strcmp(e->name, "Sub");
    if (!o || o->c || (!add && !sub) || !ox_is_int_type(o->type)) return;
    OxVal *v = y && ox_known(y) && !x->c ? x : add && ox_known(x) && y && !y->c ? y : NULL;
    OxVal *k = v == x ? y : x;
    if (!v || ox_numel(k) != 1 || ox_numel(v) != ox_numel(o) || (sub && v != x)) return;
    double c = ox_known(k)[0] * (sub ? -1 : 1);
    o->affine = true;
    o->base = v->affine ? v->base : v->v;
    o->off = (v->affine ? v->off : 0) + c;
}

static bool op_binary(OxNode *n, const Elementwise *e) {
    Graph *g = n->im->g;
    if (!ox_need_in(n, 0) || !legacy_broadcast(n)) return false;
    int type = ox_in(n, 0)->type, outtype = is_cmp(e->kop) ? OT_BOOL : type;
    bool mean = !strcmp(e->name, "Mean");
    if (n->nin == 2 && ox_all_const(n) && e->f && ox_in(n, 1))
        return ox_eval_const(n, 2, n->in, e->f, outtype);
    kiln_value acc = wide_operand(n, 0, type);
    if (n->nin == 1 && !mean) acc = kiln_unary(g, "contiguous", acc);
    bool is32 = type == OT_INT32 || type == OT_UINT32;
    bool wrap = (ox_is_narrow_int(type) || is32) && !mean &&
                (!strcmp(e->kop, "add") || !strcmp(e->kop, "sub") || !strcmp(e->kop, "mul") ||
                 !strcmp(e->kop, "pow"));
    bool wide = type == OT_INT16 || type == OT_UINT16;
    for (int k = 1; k < n->nin && acc >= 0; k++) {
        if (wrap && (wide || is32) && !strcmp(e->kop, "mul")) {
            acc = mul_wrapped(g, acc, wide_operand(n, k, type), type);
            continue;
        }
        acc = kiln_binary(g, e->kop, acc, wide_operand(n, k, type));
        if (wrap && strcmp(e->kop, "pow")) acc = ox_wrap_graph(g, acc, type);
    }
    if (mean && n->nin > 1) acc = kiln_binary(g, "div", acc, kiln_scalar(g, n->nin));
    if (!strcmp(e->kop, "div") && ox_is_int_type(type)) acc = trunc_graph(g, acc);
    if (!strcmp(e->kop, "pow") && ox_is_int_type(type)) acc = trunc_graph(g, acc);
    if (wrap && !strcmp(e->kop, "pow")) acc = ox_wrap_graph(g, acc, type);
    if (!ox_set_graph(n, 0, acc, outtype)) return false;
    if (n->nin == 2 && !mean) ox_spec_eval(n, 2, n->in, e->f, outtype);
    note_affine(n, e);
    return true;
}

static bool op_where(OxNode *n) {
    if (!ox_need_in(n, 0) || !ox_need_in(n, 1) || !ox_need_in(n, 2)) return false;
    int type = ox_in(n, 1)->type;
    if (ox_all_const(n)) return ox_eval_const(n, 3, n->in, e_where, type);
    return ox_set_graph(n, 0, kiln_where(n->im->g, ox_gin(n, 0), ox_gin(n, 1), ox_gin(n, 2)), type);
}

EVAL(e_and, a != 0 && b != 0)
EVAL(e_or, a != 0 || b != 0)
EVAL(e_xor, (a != 0) != (b != 0))

/* And, Or, Xor on bools: where(a, b, a), where(a, a, b), a != b. */
static bool op_logical(OxNode *n) {
    Graph *g = n->im->g;
    const char *op = ox_opname(n);
    if (!ox_need_in(n, 0) || !ox_need_in(n, 1) || !legacy_broadcast(n)) return false;
    EvalFn f = !strcmp(op, "And") ? e_and : !strcmp(op, "Or") ? e_or : e_xor;
    if (ox_all_const(n)) return ox_eval_const(n, 2, n->in, f, OT_BOOL);
    kiln_value a = ox_gin(n, 0), b = ox_gin(n, 1), y;
    if (f == e_and)
        y = kiln_where(g, a, b, kiln_binary(g, "ne", a, a));
    else if (f == e_or)
        y = kiln_where(g, a, kiln_binary(g, "eq", a, a), b);
    else
        y = kiln_binary(g, "ne", a, b);
    return ox_set_graph(n, 0, y, OT_BOOL);
}

static bool op_identity(OxNode *n) {
    OxVal *x = ox_in(n, 0), *o = ox_out_slot(n, 0);
    if (!ox_need_in(n, 0)) return false;
    if (o) {
        const char *name = o->name;
        *o = *x;
        o->name = name;
    }
    return true;
}

/* Dropout in inference is the identity; its mask output is all true. */
static bool op_dropout(OxNode *n) {
    OxVal *t = ox_in(n, 2), *ratio = ox_in(n, 1);
    bool zero = ratio && ox_known(ratio) && ox_numel(ratio) == 1 && ox_known(ratio)[0] == 0;
    if (t && (!ox_known(t) || ox_known(t)[0] != 0) && !zero) /* training, ratio 0: drops nothing */
        return ox_nfail(n, "unsupported: dropout in training mode (random)");
    if (!op_identity(n)) return false;
    OxVal *x = ox_in(n, 0), *mask = ox_out_slot(n, 1);
    if (!mask) return true;
    OxVal *m = ox_set_const(n, 1, OT_BOOL, x->rank, x->shape);
    if (!m) return ox_nomem(n);
    for (int64_t k = 0; k < ox_numel(m); k++) m->c[k] = 1;
    return true;
}

EVAL(e_cast_int, trunc(a))
EVAL(e_cast_bool, a != 0)

/* x rounded to float16 (bfloat16: bf) in the graph, to nearest even, as
 * storing it would: Veltkamp's split t - (t - x), t = (2^s + 1) x, keeps
 * the top 24 - s bits (s = 13: half's 11, 16: bfloat16's 8); half's
 * subnormals (below 2^-14) are multiples of 2^-24, and from 65520 on a
 * half is infinite. Checked against NumPy's float16 for every f32 in the
 * half range (tests/onnx/ops: cast_float_to_half_rounding). */
static kiln_value round_half(Graph *g, kiln_value x, bool bf) {
    kiln_value a = kiln_unary(g, "abs", x);
    kiln_value big = kiln_binary(g, "gt", a, ox_sc(g, 0x1p64)); /* bf16: keep t finite */
    kiln_value xs = bf ? kiln_where(g, big, kiln_binary(g, "mul", x, ox_sc(g, 0x1p-64)), x) : x;
    kiln_value t = kiln_binary(g, "mul", xs, ox_sc(g, bf ? 65537 : 8193));
    kiln_value hi = kiln_binary(g, "sub", t, kiln_binary(g, "sub", t, xs));
    if (bf) return kiln_where(g, big, kiln_binary(g, "mul", hi, ox_sc(g, 0x1p64)), hi);
    kiln_value sub = kiln_binary(
        g, "mul", ox_round_even(g, kiln_binary(g, "mul", x, ox_sc(g, 0x1p24))), ox_sc(g, 0x1p-24));
    kiln_value y = kiln_where(g, kiln_binary(g, "lt", a, ox_sc(g, 0x1p-14)), sub, hi);
    return kiln_where(g, kiln_binary(g, "ge", a, ox_sc(g, 65520)),
                      kiln_binary(g, "mul", x, ox_sc(g, 1e38)), y); /* +-inf */
}

static bool cast_to(OxNode *n, int to) {
    Graph *g = n->im->g;
    OxVal *x = ox_in(n, 0);
    if (!x) return ox_need_in(n, 0);
    if (to != OT_FLOAT && to != OT_DOUBLE && to != OT_BOOL && !ox_is_int_type(to) &&
        !ox_is_half_type(to))
        return ox_nfail(n, "unsupported: cast to %s", ox_type_name(to));
    EvalFn f = to == OT_BOOL ? e_cast_bool : ox_is_int_type(to) ? e_cast_int : e_copy;
    if (x->c) return ox_eval_const(n, 1, &x, f, to);
    kiln_value v = ox_gin(n, 0);
    /* from a double: to f32 first (rounded once), where the result is not
     * a double; a half from a double is rounded twice (to float, then to
     * half), which differs from one rounding only at a float-rounded tie */
    if (x->type == OT_DOUBLE && to != OT_DOUBLE && to != OT_BOOL)
        v = ox_is_wide_int(to)   ? trunc_graph(g, v) /* stays f64: exact to 2^53 */
            : ox_is_int_type(to) ? kiln_cast(g, trunc_graph(g, v), KILN_F32)
                                 : kiln_cast(g, v, KILN_F32);
    else if (kiln_value_dtype(g, v) == KILN_F64 && (to == OT_FLOAT || ox_is_half_type(to)))
        v = kiln_cast(g, v, KILN_F32); /* an int32/int64 held in f64 */
    if (to == OT_DOUBLE) v = kiln_cast(g, v, KILN_F64);
    if (to == OT_BOOL && x->type != OT_BOOL)
        v = kiln_binary(g, "ne", v, kiln_scalar(g, 0));
    else if (to != OT_BOOL && x->type == OT_BOOL)
        v = kiln_binary(g, "add", v, kiln_scalar(g, 0));
    else if (ox_is_int_type(to) && !ox_is_int_type(x->type) && x->type != OT_DOUBLE)
        v = trunc_graph(g, v);
    if (ox_is_int_type(to) && to != x->type) v = ox_wrap_graph(g, v, to);
    /* bools, int8 and uint8 are exact in either half type */
    bool exact = x->type == to || x->type == OT_BOOL || x->type == OT_INT8 || x->type == OT_UINT8;
    if (ox_is_half_type(to) && !exact) v = round_half(g, v, to == OT_BFLOAT16);
    if (!ox_set_graph(n, 0, v, to)) return false;
    ox_spec_eval(n, 1, &x, f, to);
    return true;
}

static bool op_cast(OxNode *n) { return cast_to(n, (int)ox_attr_i(n, "to", OT_FLOAT)); }
static bool op_cast_like(OxNode *n) { return ox_need_in(n, 1) && cast_to(n, ox_in(n, 1)->type); }

/* ---- activations (decomposed) --------------------------------------------- */

static bool op_leaky_relu(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value x = ox_gin(n, 0);
    double a = ox_attr_f(n, "alpha", 0.01);
    kiln_value neg = kiln_binary(g, "lt", x, kiln_scalar(g, 0));
    return ox_set_graph(n, 0, kiln_where(g, neg, kiln_binary(g, "mul", x, kiln_scalar(g, a)), x),
                        OT_FLOAT);
}

/* Before opset 7 a 1-D slope holds one value per channel (dim 1). */
static bool op_prelu(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value x = ox_gin(n, 0), slope = ox_gin(n, 1);
    OxVal *sv = ox_in(n, 1);
    if (n->im->opset < 7 && x >= 0 && sv && sv->rank == 1 && kiln_value_rank(g, x) > 2 &&
        sv->shape[0] == kiln_value_shape(g, x)[1] && sv->shape[0] > 1)
        slope = ox_per_channel(g, slope, kiln_value_rank(g, x));
    kiln_value neg = kiln_binary(g, "lt", x, kiln_scalar(g, 0));
    return ox_set_graph(n, 0, kiln_where(g, neg, kiln_binary(g, "mul", x, slope), x), OT_FLOAT);
}

/* alpha * (exp(x) - 1) where x < 0 (<= 0 for Selu), else x; times gamma. */
static kiln_value elu(Graph *g, kiln_value x, double alpha, double gamma, const char *cmp) {
    kiln_value em1 = kiln_binary(g, "sub", kiln_unary(g, "exp", x), kiln_scalar(g, 1));
    kiln_value neg = kiln_binary(g, "mul", em1, kiln_scalar(g, alpha));
    kiln_value y = kiln_where(g, kiln_binary(g, cmp, x, kiln_scalar(g, 0)), neg, x);
    return gamma == 1 ? y : kiln_binary(g, "mul", y, kiln_scalar(g, gamma));
}

static bool op_elu(OxNode *n) {
    return ox_set_graph(n, 0, elu(n->im->g, ox_gin(n, 0), ox_attr_f(n, "alpha", 1.0), 1, "lt"),
                        OT_FLOAT);
}

static bool op_selu(OxNode *n) {
    double a = ox_attr_f(n, "alpha", 1.67326319217681884765625);
    double gm = ox_attr_f(n, "gamma", 1.05070102214813232421875);
    return ox_set_graph(n, 0, elu(n->im->g, ox_gin(n, 0), a, gm, "le"), OT_FLOAT);
}

static kiln_value hard_sigmoid(Graph *g, kiln_value x, double alpha, double beta) {
    kiln_value t = kiln_binary(g, "add", kiln_binary(g, "mul", x, kiln_scalar(g, alpha)),
                               kiln_scalar(g, beta));
    return kiln_clamp(g, t, 1, 0, 1, 1);
}

static bool op_hard_sigmoid(OxNode *n) {
    kiln_value y =
        hard_sigmoid(n->im->g, ox_gin(n, 0), ox_attr_f(n, "alpha", 0.2), ox_attr_f(n, "beta", 0.5));
    return ox_set_graph(n, 0, y, OT_FLOAT);
}

static bool op_hard_swish(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value x = ox_gin(n, 0);
    return ox_set_graph(n, 0, kiln_binary(g, "mul", x, hard_sigmoid(g, x, 1.0 / 6, 0.5)), OT_FLOAT);
}

/* ---- more activations and elementwise math -------------------------------- */

kiln_value ox_sc(Graph *g, double v) { return kiln_scalar(g, v); }

static bool op_sign(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value x = ox_gin(n, 0);
    kiln_value neg = kiln_where(g, kiln_binary(g, "lt", x, ox_sc(g, 0)), ox_sc(g, -1), ox_sc(g, 0));
    return ox_set_graph(n, 0, kiln_where(g, kiln_binary(g, "gt", x, ox_sc(g, 0)), ox_sc(g, 1), neg),
                        ox_in(n, 0)->type);
}

static bool op_thresholded_relu(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value x = ox_gin(n, 0);
    kiln_value keep = kiln_binary(g, "gt", x, ox_sc(g, ox_attr_f(n, "alpha", 1.0)));
    return ox_set_graph(n, 0, kiln_where(g, keep, x, ox_sc(g, 0)), OT_FLOAT);
}

static bool op_softsign(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value x = ox_gin(n, 0);
    kiln_value d = kiln_binary(g, "add", kiln_unary(g, "abs", x), ox_sc(g, 1));
    return ox_set_graph(n, 0, kiln_binary(g, "div", x, d), OT_FLOAT);
}

/* IsNaN: x != x. IsInf: beyond the largest finite f32, by sign. */
static bool op_isnan(OxNode *n) {
    kiln_value x = ox_gin(n, 0);
    return ox_set_graph(n, 0, kiln_binary(n->im->g, "ne", x, x), OT_BOOL);
}

static bool op_isinf(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value x = ox_gin(n, 0);
    bool pos = ox_attr_i(n, "detect_positive", 1) != 0,
         neg = ox_attr_i(n, "detect_negative", 1) != 0;
    kiln_value y = pos && neg ? kiln_binary(g, "gt", kiln_unary(g, "abs", x), ox_sc(g, FLT_MAX))
                   : pos      ? kiln_binary(g, "gt", x, ox_sc(g, FLT_MAX))
                   : neg      ? kiln_binary(g, "lt", x, ox_sc(g, -FLT_MAX))
                              : kiln_binary(g, "lt", x, x); /* neither: all false */
    return ox_set_graph(n, 0, y, OT_BOOL);
}

static bool op_celu(OxNode *n) {
    Graph *g = n->im->g;
    double a = ox_attr_f(n, "alpha", 1.0);
    kiln_value x = ox_gin(n, 0);
    kiln_value e = kiln_unary(g, "exp", kiln_binary(g, "div", x, ox_sc(g, a)));
    kiln_value neg = kiln_binary(g, "mul", kiln_binary(g, "sub", e, ox_sc(g, 1)), ox_sc(g, a));
    kiln_value y = kiln_binary(g, "add", kiln_binary(g, "maximum", x, ox_sc(g, 0)),
                               kiln_binary(g, "minimum", neg, ox_sc(g, 0)));
    return ox_set_graph(n, 0, y, OT_FLOAT);
}

static bool op_shrink(OxNode *n) {
    Graph *g = n->im->g;
    double l = ox_attr_f(n, "lambd", 0.5), b = ox_attr_f(n, "bias", 0);
    kiln_value x = ox_gin(n, 0);
    kiln_value hi = kiln_where(g, kiln_binary(g, "gt", x, ox_sc(g, l)),
                               kiln_binary(g, "sub", x, ox_sc(g, b)), ox_sc(g, 0));
    kiln_value y = kiln_where(g, kiln_binary(g, "lt", x, ox_sc(g, -l)),
                              kiln_binary(g, "add", x, ox_sc(g, b)), hi);
    return ox_set_graph(n, 0, y, ox_in(n, 0)->type);
}

/* Tan, Sinh, Cosh, Asinh, Acosh, Atanh from sin, cos, exp, log, sqrt. */
static bool op_trig(OxNode *n) {
    Graph *g = n->im->g;
    const char *op = ox_opname(n);
    kiln_value x = ox_gin(n, 0), y;
    kiln_value ep = kiln_unary(g, "exp", x), em = kiln_unary(g, "exp", kiln_unary(g, "neg", x));
    kiln_value xx = kiln_binary(g, "mul", x, x);
    if (!strcmp(op, "Tan"))
        y = kiln_binary(g, "div", kiln_unary(g, "sin", x), kiln_unary(g, "cos", x));
    else if (!strcmp(op, "Sinh"))
        y = kiln_binary(g, "mul", kiln_binary(g, "sub", ep, em), ox_sc(g, 0.5));
    else if (!strcmp(op, "Cosh"))
        y = kiln_binary(g, "mul", kiln_binary(g, "add", ep, em), ox_sc(g, 0.5));
    else if (!strcmp(op, "Asinh"))
        y = kiln_unary(g, "log",
                       kiln_binary(g, "add", x,
                                   kiln_unary(g, "sqrt", kiln_binary(g, "add", xx, ox_sc(g, 1)))));
    else if (!strcmp(op, "Acosh"))
        y = kiln_unary(g, "log",
                       kiln_binary(g, "add", x,
                                   kiln_unary(g, "sqrt", kiln_binary(g, "sub", xx, ox_sc(g, 1)))));
    else /* Atanh */
        y = kiln_binary(g, "mul",
                        kiln_unary(g, "log",
                                   kiln_binary(g, "div", kiln_binary(g, "add", ox_sc(g, 1), x),
                                               kiln_binary(g, "sub", ox_sc(g, 1), x))),
                        ox_sc(g, 0.5));
    return ox_set_graph(n, 0, y, OT_FLOAT);
}

/* atan as Cephes' atanf: |x| reduced to [0, tan(pi/8)] by atan(t) = pi/2 +
 * atan(-1/t) above tan(3pi/8) and pi/4 + atan((t-1)/(t+1)) above
 * tan(pi/8), then an odd polynomial of degree 9 (about 2e-7 relative over
 * the line); the sign restored at the end. All pointwise: one fused loop,
 * vectorized, with no atan primitive. */
static kiln_value atan_graph(Graph *g, kiln_value x) {
    kiln_value t = kiln_unary(g, "abs", x);
    kiln_value big = kiln_binary(g, "gt", t, ox_sc(g, 2.414213562373095));
    kiln_value mid = kiln_binary(g, "gt", t, ox_sc(g, 0.4142135623730950));
    kiln_value z =
        kiln_where(g, big, kiln_binary(g, "div", ox_sc(g, -1), t),
                   kiln_where(g, mid,
                              kiln_binary(g, "div", kiln_binary(g, "sub", t, ox_sc(g, 1)),
                                          kiln_binary(g, "add", t, ox_sc(g, 1))),
                              t));
    kiln_value off =
        kiln_where(g, big, ox_sc(g, M_PI / 2), kiln_where(g, mid, ox_sc(g, M_PI / 4), ox_sc(g, 0)));
    kiln_value zz = kiln_binary(g, "mul", z, z);
    static const double c[4] = {8.05374449538e-2, -1.38776856032e-1, 1.99777106478e-1,
                                -3.33329491539e-1};
    kiln_value p = ox_sc(g, c[0]);
    for (int i = 1; i < 4; i++)
        p = kiln_binary(g, "add", kiln_binary(g, "mul", p, zz), ox_sc(g, c[i]));
    p = kiln_binary(g, "add", kiln_binary(g, "mul", kiln_binary(g, "mul", p, zz), z), z);
    kiln_value r = kiln_binary(g, "add", off, p);
    return kiln_where(g, kiln_binary(g, "lt", x, ox_sc(g, 0)), kiln_unary(g, "neg", r), r);
}

/* Atan; Asin as atan(x / sqrt((1 - x)(1 + x))) and Acos as
 * 2 atan(sqrt((1 - x) / (1 + x))): +-1 give an infinite argument and
 * +-pi/2, pi and 0 exactly; outside [-1, 1] the square root is NaN, as the
 * functions are there. (1 - x) is exact for x near 1, so neither loses
 * digits at the ends as pi/2 - asin would. */
static bool op_atrig(OxNode *n) {
    Graph *g = n->im->g;
    const char *op = ox_opname(n);
    kiln_value x = ox_gin(n, 0), y;
    kiln_value lo = kiln_binary(g, "sub", ox_sc(g, 1), x),
               hi = kiln_binary(g, "add", ox_sc(g, 1), x);
    if (!strcmp(op, "Atan"))
        y = atan_graph(g, x);
    else if (!strcmp(op, "Asin"))
        y = atan_graph(
            g, kiln_binary(g, "div", x, kiln_unary(g, "sqrt", kiln_binary(g, "mul", lo, hi))));
    else /* Acos */
        y = kiln_binary(g, "mul",
                        atan_graph(g, kiln_unary(g, "sqrt", kiln_binary(g, "div", lo, hi))),
                        ox_sc(g, 2));
    return ox_set_graph(n, 0, y, OT_FLOAT);
}

/* Mod: with fmod 1, C's fmod (the dividend's sign); with fmod 0, for
 * integers only, the divisor's sign (Python's %): fmod's remainder plus the
 * divisor where the two signs differ. Integers are exact in f32 up to
 * 2^24, as everywhere in kiln. */
static double e_fmod(double a, double b, double c, int t) {
    (void)c;
    return ox_is_int_type(t) && b == 0 ? 0 : fmod(a, b);
}
static double e_mod(double a, double b, double c, int t) {
    double r = e_fmod(a, b, c, t);
    return r != 0 && (r < 0) != (b < 0) ? r + b : r;
}

static bool op_mod(OxNode *n) {
    Graph *g = n->im->g;
    if (!ox_need_in(n, 0) || !ox_need_in(n, 1)) return false;
    int type = ox_in(n, 0)->type;
    bool fm = ox_attr_i(n, "fmod", 0) != 0;
    if (!fm && !ox_is_int_type(type))
        return ox_nfail(n, "fmod must be 1 for floating-point inputs (the spec's rule)");
    if (ox_all_const(n)) return ox_eval_const(n, 2, n->in, fm ? e_fmod : e_mod, type);
    kiln_value b = ox_gin(n, 1), r = kiln_binary(g, "fmod", ox_gin(n, 0), b);
    if (!fm) {
        kiln_value zero = ox_sc(g, 0);
        kiln_value fix =
            kiln_binary(g, "ne", kiln_binary(g, "lt", r, zero), kiln_binary(g, "lt", b, zero));
        fix = kiln_where(g, kiln_binary(g, "ne", r, zero), fix, kiln_binary(g, "ne", r, zero));
        r = kiln_where(g, fix, kiln_binary(g, "add", r, b), r);
    }
    return ox_set_graph(n, 0, r, type);
}

/* BitShift (unsigned): x * 2^y wrapped (LEFT) or floor(x / 2^y) (RIGHT),
 * exact in f32: scaling by a power of two only moves the exponent. */
static double e_shl(double a, double b, double c, int t) {
    return (void)c, ox_wrap_int(a * exp2(b), t);
}
static double e_shr(double a, double b, double c, int t) {
    return (void)c, (void)t, floor(a / exp2(b));
}

static bool op_bitshift(OxNode *n) {
    Graph *g = n->im->g;
    if (!ox_need_in(n, 0) || !ox_need_in(n, 1)) return false;
    int type = ox_in(n, 0)->type;
    bool left = ox_attr_is(n, "direction", "LEFT", false);
    if (!left && !ox_attr_is(n, "direction", "RIGHT", false))
        return ox_nfail(n, "direction must be \"LEFT\" or \"RIGHT\"");
    if (type != OT_UINT8 && type != OT_UINT16 && type != OT_UINT32 && type != OT_UINT64)
        return ox_nfail(n, "BitShift takes unsigned integers, not %s", ox_type_name(type));
    if (ox_all_const(n)) return ox_eval_const(n, 2, n->in, left ? e_shl : e_shr, type);
    kiln_value p = kiln_binary(g, "pow", ox_sc(g, 2), ox_gin(n, 1)), x = ox_gin(n, 0);
    kiln_value y = left ? ox_wrap_graph(g, kiln_binary(g, "mul", x, p), type)
                        : kiln_unary(g, "floor", kiln_binary(g, "true_divide", x, p));
    return ox_set_graph(n, 0, y, type);
}

/* Round half to even: floor(x + 0.5), less 1 on a tie that lands odd. */
kiln_value ox_round_even(Graph *g, kiln_value x) {
    kiln_value f = kiln_unary(g, "floor", kiln_binary(g, "add", x, ox_sc(g, 0.5)));
    kiln_value tie = kiln_binary(g, "eq", kiln_binary(g, "sub", f, x), ox_sc(g, 0.5));
    kiln_value half = kiln_unary(g, "floor", kiln_binary(g, "mul", f, ox_sc(g, 0.5)));
    kiln_value odd = kiln_binary(g, "ne", kiln_binary(g, "mul", half, ox_sc(g, 2)), f);
    kiln_value both = kiln_where(g, tie, odd, tie);
    return kiln_where(g, both, kiln_binary(g, "sub", f, ox_sc(g, 1)), f);
}

static bool op_round(OxNode *n) {
    return ox_set_graph(n, 0, ox_round_even(n->im->g, ox_gin(n, 0)), OT_FLOAT);
}

static bool op_softplus(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value e = kiln_unary(g, "exp", ox_gin(n, 0));
    return ox_set_graph(n, 0, kiln_unary(g, "log", kiln_binary(g, "add", e, kiln_scalar(g, 1))),
                        OT_FLOAT);
}

/* Gelu (opset 20): x Phi(x), or with approximate "tanh"
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
static bool op_gelu(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value x = ox_gin(n, 0);
    if (ox_attr_is(n, "approximate", "none", true))
        return ox_set_graph(n, 0, kiln_unary(g, "gelu", x), OT_FLOAT);
    if (!ox_attr_is(n, "approximate", "tanh", false))
        return ox_nfail(n, "approximate must be \"none\" or \"tanh\"");
    kiln_value x3 = kiln_binary(g, "mul", kiln_binary(g, "mul", x, x), x);
    kiln_value in = kiln_binary(g, "add", x, kiln_binary(g, "mul", x3, ox_sc(g, 0.044715)));
    kiln_value t = kiln_unary(g, "tanh", kiln_binary(g, "mul", in, ox_sc(g, 0.7978845608028654)));
    kiln_value h = kiln_binary(g, "mul", kiln_binary(g, "add", t, ox_sc(g, 1)), ox_sc(g, 0.5));
    return ox_set_graph(n, 0, kiln_binary(g, "mul", x, h), OT_FLOAT);
}

/* Mish (opset 18): x tanh(softplus(x)) = x m (m + 2) / (m (m + 2) + 2)
 * with m = e^x, exact for negative x (no log(1 + tiny)); x itself from
 * x = 20 on, where the fraction is 1 in float and m (m + 2) overflows
 * later. */
static bool op_mish(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value x = ox_gin(n, 0), m = kiln_unary(g, "exp", x);
    kiln_value p = kiln_binary(g, "mul", m, kiln_binary(g, "add", m, ox_sc(g, 2)));
    kiln_value f = kiln_binary(g, "div", p, kiln_binary(g, "add", p, ox_sc(g, 2)));
    kiln_value big = kiln_binary(g, "gt", x, ox_sc(g, 20));
    return ox_set_graph(n, 0, kiln_where(g, big, x, kiln_binary(g, "mul", x, f)), OT_FLOAT);
}

/* A bound of Clip: constant (has, value) or a graph value (*gv). */
static bool clip_bound(OxNode *n, int k, const char *name, double def, bool *has, double *v,
                       kiln_value *gv) {
    *gv = KILN_NONE;
    if (n->im->opset < 11) {
        *has = ox_attr(n, name) != NULL;
        *v = ox_attr_f(n, name, def);
        return true;
    }
    OxVal *b = ox_in(n, k);
    *has = b != NULL;
    if (b && b->c)
        *v = b->c[0];
    else if (b)
        *gv = ox_graph(n, b);
    return !b || b->c || *gv >= 0;
}

static bool op_clip(OxNode *n) {
    Graph *g = n->im->g;
    bool hmin, hmax;
    double lo = 0, hi = 0;
    kiln_value glo, ghi, x = ox_gin(n, 0);
    if (!clip_bound(n, 1, "min", -FLT_MAX, &hmin, &lo, &glo) ||
        !clip_bound(n, 2, "max", FLT_MAX, &hmax, &hi, &ghi))
        return false;
    if (glo >= 0) x = kiln_binary(g, "maximum", x, glo), hmin = false;
    if (ghi >= 0) x = kiln_binary(g, "minimum", x, ghi), hmax = false;
    if (hmin || hmax) x = kiln_clamp(g, x, hmin, lo, hmax, hi);
    return ox_set_graph(n, 0, x, ox_in(n, 0)->type);
}

#define LEN(a) (sizeof(a) / sizeof((a)[0]))

/* The ops of unary_ops and binary_ops: one handler for both tables. */
static bool op_elementwise(OxNode *n) {
    const char *op = ox_opname(n);
    const Elementwise *u = find_elementwise(unary_ops, LEN(unary_ops), op);
    return u ? op_unary(n, u) : op_binary(n, find_elementwise(binary_ops, LEN(binary_ops), op));
}

OxHandlerFn ox_elementwise_fn(const char *op) {
    bool found = find_elementwise(unary_ops, LEN(unary_ops), op) ||
                 find_elementwise(binary_ops, LEN(binary_ops), op);
    return found ? op_elementwise : NULL;
}

/* ---- this file's handlers (onnx_ops.c looks ops up here) ---------------- */

const OxHandler ox_elementwise_ops[] = {
    {"Where", op_where},
    {"Identity", op_identity},
    {"And", op_logical},
    {"Or", op_logical},
    {"Xor", op_logical},
    {"Dropout", op_dropout},
    {"Cast", op_cast},
    {"CastLike", op_cast_like},
    {"LeakyRelu", op_leaky_relu},
    {"PRelu", op_prelu},
    {"Elu", op_elu},
    {"Selu", op_selu},
    {"HardSigmoid", op_hard_sigmoid},
    {"HardSwish", op_hard_swish},
    {"Softplus", op_softplus},
    {"Gelu", op_gelu},
    {"Mish", op_mish},
    {"Clip", op_clip},
    {"Sign", op_sign},
    {"ThresholdedRelu", op_thresholded_relu},
    {"Softsign", op_softsign},
    {"IsNaN", op_isnan},
    {"IsInf", op_isinf},
    {"Celu", op_celu},
    {"Shrink", op_shrink},
    {"Tan", op_trig},
    {"Sinh", op_trig},
    {"Cosh", op_trig},
    {"Asinh", op_trig},
    {"Acosh", op_trig},
    {"Atanh", op_trig},
    {"Round", op_round},
    {"Atan", op_atrig},
    {"Asin", op_atrig},
    {"Acos", op_atrig},
    {"Mod", op_mod},
    {"BitShift", op_bitshift},
};
const size_t ox_elementwise_nops = sizeof ox_elementwise_ops / sizeof ox_elementwise_ops[0];
