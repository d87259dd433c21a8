/*
 * onnx_train.c -- the optimizer updates of ONNX's ai.onnx.preview.training
 * domain: Adagrad, Momentum (standard and Nesterov) and Adam, each over
 * any number of tensors at once. They are pointwise formulas of the
 * learning rate R, the update count T (both scalars, known or run-time)
 * and the tensors, so each tensor's update is one fused loop. Gradient
 * differentiates the main graph's elementwise nodes that lead to y
 * (reverse mode, the adjoints summed over broadcast dims).
 */
#include "front/front.h"
#include <string.h>

static kiln_value b2(Graph *g, const char *op, kiln_value a, kiln_value b) {
    return kiln_binary(g, op, a, b);
}

/* The node's tensors come in groups: X1..Xn, G1..Gn, and `states` more
 * groups; n from the input count. */
static int groups(OxNode *n, int states) {
    int rest = n->nin - 2, per = 2 + states;
    if (rest < per || rest % per || (int)n->n->n_output != rest / per * (1 + states))
        return ox_nfail(n, "the inputs and outputs do not come in groups of %d", per), -1;
    for (int k = 0; k < n->nin; k++)
        if (!ox_need_in(n, k)) return -1;
    return rest / per;
}

/* norm_coefficient * X + G */
static kiln_value regularized(OxNode *n, kiln_value x, kiln_value gr) {
    Graph *g = n->im->g;
    double lam = ox_attr_f(n, "norm_coefficient", 0);
    return lam ? b2(g, "add", b2(g, "mul", x, ox_sc(g, lam)), gr) : gr;
}

static bool op_adagrad(OxNode *n) {
    int m = groups(n, 1);
    if (m < 0) return false;
    Graph *g = n->im->g;
    double decay = ox_attr_f(n, "decay_factor", 0), eps = ox_attr_f(n, "epsilon", 0);
    /* r = R / (1 + T decay) */
    kiln_value r = b2(g, "div", ox_gin(n, 0),
                      b2(g, "add", ox_sc(g, 1), b2(g, "mul", ox_gin(n, 1), ox_sc(g, decay))));
    for (int i = 0; i < m; i++) {
        kiln_value x = ox_gin(n, 2 + i), gr = regularized(n, x, ox_gin(n, 2 + m + i));
        kiln_value h = b2(g, "add", ox_gin(n, 2 + 2 * m + i), b2(g, "mul", gr, gr));
        kiln_value ad = b2(g, "add", kiln_unary(g, "sqrt", h), ox_sc(g, eps));
        kiln_value xn = b2(g, "sub", x, b2(g, "div", b2(g, "mul", r, gr), ad));
        if (!ox_set_graph(n, i, xn, OT_FLOAT) || !ox_set_graph(n, m + i, h, OT_FLOAT)) return false;
    }
    return true;
}

static bool op_momentum(OxNode *n) {
    int m = groups(n, 1);
    if (m < 0) return false;
    Graph *g = n->im->g;
    double alpha = ox_attr_f(n, "alpha", 0), beta = ox_attr_f(n, "beta", 0);
    bool nesterov = ox_attr_is(n, "mode", "nesterov", false);
    if (!nesterov && !ox_attr_is(n, "mode", "standard", true))
        return ox_nfail(n, "mode must be \"standard\" or \"nesterov\"");
    /* beta at T > 0, 1 at the first update */
    kiln_value bt =
        kiln_where(g, b2(g, "gt", ox_gin(n, 1), ox_sc(g, 0)), ox_sc(g, beta), ox_sc(g, 1));
    for (int i = 0; i < m; i++) {
        kiln_value x = ox_gin(n, 2 + i), gr = regularized(n, x, ox_gin(n, 2 + m + i));
        kiln_value v = b2(g, "add", b2(g, "mul", ox_gin(n, 2 + 2 * m + i), ox_sc(g, alpha)),
                          b2(g, "mul", bt, gr));
        kiln_value step = nesterov ? b2(g, "add", gr, b2(g, "mul", v, ox_sc(g, alpha))) : v;
        kiln_value xn = b2(g, "sub", x, b2(g, "mul", ox_gin(n, 0), step));
        if (!ox_set_graph(n, i, xn, OT_FLOAT) || !ox_set_graph(n, m + i, v, OT_FLOAT)) return false;
    }
    return true;
}

static bool op_adam(OxNode *n) {
    int m = groups(n, 2);
    if (m < 0) return false;
    Graph *g = n->im->g;
    double alpha = ox_attr_f(n, "alpha", 0.9), beta = ox_attr_f(n, "beta", 0.999);
    double eps = ox_attr_f(n, "epsilon", 0), post = ox_attr_f(n, "norm_coefficient_post", 0);
    kiln_value R = ox_gin(n, 0), T = ox_gin(n, 1);
    /* R sqrt(1 - beta^T) / (1 - alpha^T) once T > 0 */
    kiln_value bias = b2(
        g, "div", kiln_unary(g, "sqrt", b2(g, "sub", ox_sc(g, 1), b2(g, "pow", ox_sc(g, beta), T))),
        b2(g, "sub", ox_sc(g, 1), b2(g, "pow", ox_sc(g, alpha), T)));
    kiln_value ra = kiln_where(g, b2(g, "gt", T, ox_sc(g, 0)), b2(g, "mul", R, bias), R);
    for (int i = 0; i < m; i++) {
        kiln_value x = ox_gin(n, 2 + i), gr = regularized(n, x, ox_gin(n, 2 + m + i));
        kiln_value v = b2(g, "add", b2(g, "mul", ox_gin(n, 2 + 2 * m + i), ox_sc(g, alpha)),
                          b2(g, "mul", gr, ox_sc(g, 1 - alpha)));
        kiln_value h = b2(g, "add", b2(g, "mul", ox_gin(n, 2 + 3 * m + i), ox_sc(g, beta)),
                          b2(g, "mul", b2(g, "mul", gr, gr), ox_sc(g, 1 - beta)));
        kiln_value hs = b2(g, "add", kiln_unary(g, "sqrt", h), ox_sc(g, eps));
        kiln_value xn = b2(g, "sub", x, b2(g, "div", b2(g, "mul", ra, v), hs));
        if (post) xn = b2(g, "mul", xn, ox_sc(g, 1 - post));
        if (!ox_set_graph(n, i, xn, OT_FLOAT) || !ox_set_graph(n, m + i, v, OT_FLOAT) ||
            !ox_set_graph(n, 2 * m + i, h, OT_FLOAT))
            return false;
    }
    return true;
}

/* ---- Gradient ------------------------------------------------------------ */

enum { GRAD_MAX = 256 };

typedef struct {
    const char *name;
    kiln_value adj;
} Adj;

typedef struct {
    Adj a[GRAD_MAX];
    int n;
} Adjs;

static kiln_value *adj_of(Adjs *A, const char *name) {
    for (int i = 0; i < A->n; i++)
        if (!strcmp(A->a[i].name, name)) return &A->a[i].adj;
    return NULL;
}

/* g summed down to v's shape (the dims v was broadcast over). */
static kiln_value unbroadcast(Graph *g, kiln_value d, const OxVal *v) {
    int r = kiln_value_rank(g, d), lead = r - v->rank, dims[KILN_MAX_RANK], nd = 0;
    const int64_t *s = kiln_value_shape(g, d);
    for (int i = 0; i < r; i++)
        if (i < lead || (v->shape[i - lead] == 1 && s[i] != 1)) dims[nd++] = i;
    if (nd) d = kiln_reduce(g, "sum", d, nd, dims, 1);
    return kiln_reshape(g, d, v->rank, v->shape);
}

static bool add_adj(OxNode *n, Adjs *A, const char *name, kiln_value d) {
    Graph *g = n->im->g;
    OxVal *v = ox_find(n->im, name);
    if (d < 0) return false;
    if (!v) return ox_nfail(n, "'%s' is not defined", name);
    d = unbroadcast(g, d, v);
    kiln_value *p = adj_of(A, name);
    if (p) return (*p = kiln_binary(g, "add", *p, d)) >= 0;
    if (A->n == GRAD_MAX)
        return ox_nfail(n, "unsupported: more than %d values to differentiate", GRAD_MAX);
    A->a[A->n++] = (Adj){name, d};
    return true;
}

static bool op_gradient(OxNode *n) {
    OxImp *im = n->im;
    Graph *g = im->g;
    const Onnx__AttributeProto *xa = ox_attr(n, "xs"), *ya = ox_attr(n, "y");
    if (!xa || !ya || !ya->s.data) return ox_nfail(n, "the xs and y attributes are required");
    if (ox_attr(n, "zs")) return ox_nfail(n, "unsupported: zs");
    const Onnx__GraphProto *gp = im->graph;
    if (!gp || n->index < 0 || (size_t)n->index >= gp->n_node || gp->node[n->index] != n->n)
        return ox_nfail(n, "unsupported: a Gradient inside a subgraph");
    char y[256];
    util_fmt(y, sizeof y, "%.*s", (int)ya->s.len, (const char *)ya->s.data);
    OxVal *yv = ox_find(im, y);
    if (!yv || yv->is_seq) return ox_nfail(n, "y '%s' is not a tensor computed before", y);
    static _Thread_local Adjs A;
    A.n = 0;
    kiln_value seed = kiln_binary(g, "add", kiln_binary(g, "mul", ox_graph(n, yv), ox_sc(g, 0)),
                                  ox_sc(g, 1)); /* ones of y's shape */
    if (!add_adj(n, &A, y, seed)) return false;
    for (int i = n->index - 1; i >= 0; i--) {
        const Onnx__NodeProto *f = gp->node[i];
        if (f->n_output != 1 || !adj_of(&A, f->output[0])) continue;
        kiln_value d = *adj_of(&A, f->output[0]);
        const char *op = f->op_type ? f->op_type : "";
        OxVal *a = f->n_input > 0 ? ox_find(im, f->input[0]) : NULL;
        OxVal *b = f->n_input > 1 ? ox_find(im, f->input[1]) : NULL;
        OxVal *o = ox_find(im, f->output[0]);
        bool two =
            !strcmp(op, "Add") || !strcmp(op, "Sub") || !strcmp(op, "Mul") || !strcmp(op, "Div");
        if (!a || (two && (!b || f->n_input != 2)))
            return ox_nfail(n, "unsupported: the gradient through node %d (%s)", i, op);
        kiln_value av = ox_graph(n, a), bv = two ? ox_graph(n, b) : KILN_NONE, ov = ox_graph(n, o);
        bool ok = true;
        if (!strcmp(op, "Add") || !strcmp(op, "Sub")) {
            ok = add_adj(n, &A, f->input[0], d) &&
                 add_adj(n, &A, f->input[1], op[0] == 'S' ? kiln_unary(g, "neg", d) : d);
        } else if (!strcmp(op, "Mul")) {
            ok = add_adj(n, &A, f->input[0], kiln_binary(g, "mul", d, bv)) &&
                 add_adj(n, &A, f->input[1], kiln_binary(g, "mul", d, av));
        } else if (!strcmp(op, "Div")) {
            kiln_value q = kiln_binary(g, "div", d, bv);
            ok = add_adj(n, &A, f->input[0], q) &&
                 add_adj(
                     n, &A, f->input[1],
                     kiln_unary(g, "neg", kiln_binary(g, "mul", q, kiln_binary(g, "div", av, bv))));
        } else if (!strcmp(op, "Neg")) {
            ok = add_adj(n, &A, f->input[0], kiln_unary(g, "neg", d));
        } else if (!strcmp(op, "Identity")) {
            ok = add_adj(n, &A, f->input[0], d);
        } else if (!strcmp(op, "Relu")) {
            ok = add_adj(n, &A, f->input[0],
                         kiln_where(g, kiln_binary(g, "gt", av, ox_sc(g, 0)), d, ox_sc(g, 0)));
        } else if (!strcmp(op, "Exp")) {
            ok = add_adj(n, &A, f->input[0], kiln_binary(g, "mul", d, ov));
        } else if (!strcmp(op, "Tanh")) {
            ok = add_adj(
                n, &A, f->input[0],
                kiln_binary(g, "mul", d,
                            kiln_binary(g, "sub", ox_sc(g, 1), kiln_binary(g, "mul", ov, ov))));
        } else if (!strcmp(op, "Sigmoid")) {
            ok = add_adj(n, &A, f->input[0],
                         kiln_binary(g, "mul", kiln_binary(g, "mul", d, ov),
                                     kiln_binary(g, "sub", ox_sc(g, 1), ov)));
        } else {
            return ox_nfail(n,
                            "unsupported: the gradient through %s (node %d; kiln differentiates "
                            "Add, Sub, Mul, Div, Neg, Identity, Relu, Exp, Tanh, Sigmoid)",
                            op, i);
        }
        if (!ok) return false;
    }
    for (size_t k = 0; k < xa->n_strings && k < n->n->n_output; k++) {
        char x[256];
        util_fmt(x, sizeof x, "%.*s", (int)xa->strings[k].len, (const char *)xa->strings[k].data);
        OxVal *xv = ox_find(im, x);
        if (!xv) return ox_nfail(n, "xs names '%s', which is not defined", x);
        kiln_value *p = adj_of(&A, x);
        kiln_value d =
            p ? *p : kiln_binary(g, "mul", ox_graph(n, xv), ox_sc(g, 0)); /* y ignores x */
        if (!ox_set_graph(n, (int)k, d, OT_FLOAT)) return false;
    }
    return true;
}

const OxHandler ox_train_ops[] = {
    {"Gradient", op_gradient},
    {"Adagrad", op_adagrad},
    {"Momentum", op_momentum},
    {"Adam", op_adam},
};
const size_t ox_train_nops = sizeof ox_train_ops / sizeof ox_train_ops[0];
