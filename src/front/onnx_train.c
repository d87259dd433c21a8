/*
 * onnx_train.c -- the optimizer updates of ONNX's ai.onnx.preview.training
 * domain: Adagrad, Momentum (standard and Nesterov) and Adam, each over
 * any number of tensors at once. They are pointwise formulas of the
 * learning rate R, the update count T (both scalars, known or run-time)
 * and the tensors, so each tensor's update is one fused loop. Gradient
 * (automatic differentiation) is not imported.
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

const OxHandler ox_train_ops[] = {
    {"Adagrad", op_adagrad},
    {"Momentum", op_momentum},
    {"Adam", op_adam},
};
const size_t ox_train_nops = sizeof ox_train_ops / sizeof ox_train_ops[0];
