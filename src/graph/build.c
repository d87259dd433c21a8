/*
 * build.c -- the public builders: kiln_input ... kiln_conv2d, one node each.
 *
 * Builders check their operands and infer the result's shape (numpy
 * broadcasting for pointwise ops, PyTorch rules for the rest) before a node
 * is appended (graph_add), so a graph that exists is well typed. A builder
 * handed KILN_NONE, or called on a graph that already failed, fails without
 * replacing the first message. Composite ops (softmax, layer_norm, ...) are
 * stored as single nodes; decompose.c rewrites them before lowering or
 * interpreting.
 */
#include "graph/graph.h"
#include <math.h>
#include <string.h>

/* ---- operand checks ----------------------------------------------------- */

static bool ok_optional(Graph *g, kiln_value v, const char *op) {
    return v == KILN_NONE ? g->status == KILN_OK : graph_ok_value(g, v, op);
}

/* The library calls (matmul, conv, gather) and random ops compute in f32. */
static bool want_f32(Graph *g, kiln_value v, const char *op) {
    if (g->nodes[v].dtype == KILN_F32) return true;
    graph_fail(g, KILN_ERR_INPUT, "%s expects an f32 tensor, got %s%s", op,
               kiln_dtype_name(g->nodes[v].dtype),
               g->nodes[v].dtype == KILN_F64 ? " (its library computes in f32)" : "");
    return false;
}

/* Pointwise math, reductions and the composites built of them compute in
 * f32 or f64. */
static bool want_float(Graph *g, kiln_value v, const char *op) {
    kiln_dtype dt = g->nodes[v].dtype;
    if (dt == KILN_F32 || dt == KILN_F64) return true;
    graph_fail(g, KILN_ERR_INPUT, "%s expects an f32 or f64 tensor, got %s", op,
               kiln_dtype_name(dt));
    return false;
}

/* The type a pointwise op computes in: f64 when an operand is f64, else
 * f32 (bools take part as 0/1). A scalar constant (kiln_scalar) takes the
 * other operands' type, as a Python number does in PyTorch. */
static kiln_dtype compute_type(const Graph *g, int nin, const int *in) {
    for (int k = 0; k < nin; k++)
        if (g->nodes[in[k]].dtype == KILN_F64 && g->nodes[in[k]].op != OP_CONST) return KILN_F64;
    return KILN_F32;
}

/* Normalize a dim for a tensor of rank `rank` (negative counts from the end). */
static bool norm_dim(Graph *g, const char *op, int rank, int64_t d, int64_t *out) {
    int64_t r = rank ? rank : 1; /* a scalar accepts dim 0 / -1 like torch */
    if (d < -r || d >= r) {
        graph_fail(g, KILN_ERR_INPUT, "%s: dim %lld is out of range for a tensor of rank %d", op,
                   (long long)d, rank);
        return false;
    }
    *out = d < 0 ? d + r : d;
    return true;
}

static Node node_like(Op op, const Node *shape_of) {
    Node n;
    memset(&n, 0, sizeof n);
    n.op = op;
    n.dtype = KILN_F32;
    for (int k = 0; k < MAX_IN; k++) n.in[k] = -1;
    if (shape_of) {
        n.rank = shape_of->rank;
        memcpy(n.shape, shape_of->shape, sizeof n.shape);
    }
    return n;
}

static bool check_shape(Graph *g, const char *what, int rank, const int64_t *shape) {
    if (rank < 0 || rank > KILN_MAX_RANK) {
        graph_fail(g, KILN_ERR_INPUT, "%s: rank %d is not supported (0 to %d)", what, rank,
                   KILN_MAX_RANK);
        return false;
    }
    for (int i = 0; i < rank; i++)
        if (shape[i] < 0) {
            graph_fail(g, KILN_ERR_INPUT, "%s: dim %d is %lld; dims must not be negative", what, i,
                       (long long)shape[i]);
            return false;
        }
    if (util_numel(rank, shape) < 0) {
        graph_fail(g, KILN_ERR_INPUT, "%s: shape has too many elements", what);
        return false;
    }
    return true;
}

/* ---- sources ------------------------------------------------------------- */

static bool name_taken(const Graph *g, const char *name) {
    for (int i = 0; i < g->n; i++)
        if ((g->nodes[i].op == OP_INPUT || g->nodes[i].op == OP_WEIGHT) && g->nodes[i].name &&
            strcmp(g->nodes[i].name, name) == 0)
            return true;
    return false;
}

static int add_source(Graph *g, Op op, const char *name, kiln_dtype dt, int rank,
                      const int64_t *shape) {
    const char *what = op == OP_INPUT ? "input" : "weight";
    if (g->status != KILN_OK) return KILN_NONE;
    if (!name || !*name) return graph_fail(g, KILN_ERR_INPUT, "%s needs a name", what);
    if (name_taken(g, name))
        return graph_fail(g, KILN_ERR_INPUT, "%s '%s' is declared twice", what, name);
    if (dt != KILN_F32 && dt != KILN_F64 && dt != KILN_BOOL)
        return graph_fail(g, KILN_ERR_INPUT,
                          "%s '%s': dtype %s is not supported; programs compute in f32, f64 "
                          "and bool",
                          what, name, kiln_dtype_name(dt));
    if (!check_shape(g, what, rank, shape)) return KILN_NONE;
    Node n = node_like(op, NULL);
    n.dtype = dt;
    n.rank = rank;
    if (rank) memcpy(n.shape, shape, sizeof(int64_t) * (size_t)rank);
    if (!(n.name = arena_strdup(&g->arena, name))) return graph_nomem(g);
    return graph_add(g, &n);
}

kiln_value kiln_input(kiln_graph *g, const char *name, kiln_dtype dtype, int rank,
                      const int64_t *shape) {
    int v = add_source(g, OP_INPUT, name, dtype, rank, shape);
    if (v >= 0 && !graph_push_int(&g->inputs, &g->ninputs, &g->capinputs, v)) return graph_nomem(g);
    return v;
}

int graph_weight_alloc_typed(Graph *g, const char *name, kiln_dtype dt, int rank,
                             const int64_t *shape, void **data) {
    if (g->status == KILN_OK && dt != KILN_F32 && dt != KILN_F64)
        return graph_fail(g, KILN_ERR_INPUT, "weight '%s': dtype %s is not supported (f32, f64)",
                          name ? name : "", kiln_dtype_name(dt));
    int v = add_source(g, OP_WEIGHT, name, dt, rank, shape);
    if (v < 0) return v;
    size_t bytes = (size_t)loop_storage_size(dt) * (size_t)node_numel(&g->nodes[v]);
    float *d = arena_alloc_lines(&g->arena, bytes ? bytes : sizeof(double));
    if (!d) return graph_nomem(g);
    g->nodes[v].data = d;
    *data = d;
    return v;
}

int graph_weight_alloc(Graph *g, const char *name, int rank, const int64_t *shape, float **data) {
    void *d = NULL;
    int v = graph_weight_alloc_typed(g, name, KILN_F32, rank, shape, &d);
    *data = d;
    return v;
}

kiln_value kiln_weight_typed(kiln_graph *g, const char *name, kiln_dtype dtype, int rank,
                             const int64_t *shape, const void *data) {
    void *d = NULL;
    int v = graph_weight_alloc_typed(g, name, dtype, rank, shape, &d);
    if (v < 0) return v;
    size_t bytes = (size_t)loop_storage_size(dtype) * (size_t)node_numel(&g->nodes[v]);
    if (!data && bytes) return graph_fail(g, KILN_ERR_INPUT, "weight '%s' has no data", name);
    if (bytes) memcpy(d, data, bytes);
    return v;
}

kiln_value kiln_weight(kiln_graph *g, const char *name, int rank, const int64_t *shape,
                       const float *data) {
    return kiln_weight_typed(g, name, KILN_F32, rank, shape, data);
}

kiln_value kiln_scalar(kiln_graph *g, double v) {
    if (g->status != KILN_OK) return KILN_NONE;
    Node n = node_like(OP_CONST, NULL);
    n.f[0] = v;
    return graph_add(g, &n);
}

/* ---- pointwise ------------------------------------------------------------ */

/* numpy broadcasting of n operands into out (rank and shape). */
static bool broadcast(Graph *g, const char *op, int nin, const int *in, Node *out) {
    out->rank = 0;
    for (int k = 0; k < nin; k++)
        if (g->nodes[in[k]].rank > out->rank) out->rank = g->nodes[in[k]].rank;
    for (int d = 0; d < out->rank; d++) out->shape[d] = 1;
    for (int k = 0; k < nin; k++) {
        const Node *a = &g->nodes[in[k]];
        for (int d = 0; d < a->rank; d++) {
            int64_t *o = &out->shape[out->rank - a->rank + d];
            int64_t s = a->shape[d];
            if (s == *o || s == 1) continue;
            if (*o == 1) {
                *o = s;
                continue;
            }
            char sa[128], sb[128];
            graph_shape_str(sa, sizeof sa, g->nodes[in[0]].rank, g->nodes[in[0]].shape);
            graph_shape_str(sb, sizeof sb, a->rank, a->shape);
            graph_fail(g, KILN_ERR_INPUT, "%s: shapes %s and %s cannot be broadcast", op, sa, sb);
            return false;
        }
    }
    return true;
}

static int pointwise(Graph *g, Op op, int nin, const int *in, kiln_dtype dt) {
    Node n = node_like(op, NULL);
    n.nin = nin;
    for (int k = 0; k < nin; k++) n.in[k] = in[k];
    n.dtype = dt;
    if (!broadcast(g, op_info[op].name, nin, in, &n)) return KILN_NONE;
    return graph_add(g, &n);
}

static bool is_cmp(Op op) { return op >= OP_LT && op <= OP_NE; }

/* unary pointwise ops and the unary composite silu */
kiln_value kiln_unary(kiln_graph *g, const char *opname, kiln_value x) {
    int op = op_lookup(opname ? opname : "");
    bool composite = op == OP_SILU;
    if (op == OP_CAST)
        return g->status ? KILN_NONE
                         : graph_fail(g, KILN_ERR_INPUT, "cast needs a dtype (kiln_cast)");
    if (op < 0 || (!composite && (op_info[op].kind != KIND_POINTWISE || op_info[op].arity != 1)))
        return g->status ? KILN_NONE
                         : graph_fail(g, KILN_ERR_INPUT, "unknown unary op '%s'", opname);
    if (!graph_ok_value(g, x, opname)) return KILN_NONE;
    if (op == OP_LOGICAL_NOT) {
        if (g->nodes[x].dtype != KILN_BOOL)
            return graph_fail(g, KILN_ERR_INPUT, "logical_not expects a bool tensor, got %s",
                              kiln_dtype_name(g->nodes[x].dtype));
        return pointwise(g, op, 1, &x, KILN_BOOL);
    }
    if (op == OP_COPY) return pointwise(g, op, 1, &x, g->nodes[x].dtype);
    if (!want_float(g, x, opname)) return KILN_NONE;
    return pointwise(g, op, 1, &x, g->nodes[x].dtype);
}

kiln_value kiln_binary(kiln_graph *g, const char *opname, kiln_value a, kiln_value b) {
    int op = op_lookup(opname ? opname : "");
    if (op < 0 || op_info[op].kind != KIND_POINTWISE || op_info[op].arity != 2)
        return g->status ? KILN_NONE
                         : graph_fail(g, KILN_ERR_INPUT, "unknown binary op '%s'", opname);
    if (!graph_ok_value(g, a, opname) || !graph_ok_value(g, b, opname)) return KILN_NONE;
    int in[2] = {a, b};
    /* bool operands take part as 0/1 (as in PyTorch's type promotion) */
    return pointwise(g, op, 2, in, is_cmp(op) ? KILN_BOOL : compute_type(g, 2, in));
}

kiln_value kiln_where(kiln_graph *g, kiln_value c, kiln_value a, kiln_value b) {
    if (!graph_ok_value(g, c, "where") || !graph_ok_value(g, a, "where") ||
        !graph_ok_value(g, b, "where"))
        return KILN_NONE;
    if (g->nodes[c].dtype != KILN_BOOL)
        return graph_fail(g, KILN_ERR_INPUT, "where: the condition must be a bool tensor, got %s",
                          kiln_dtype_name(g->nodes[c].dtype));
    int in[3] = {c, a, b};
    bool both_bool = g->nodes[a].dtype == KILN_BOOL && g->nodes[b].dtype == KILN_BOOL;
    return pointwise(g, OP_WHERE, 3, in, both_bool ? KILN_BOOL : compute_type(g, 2, in + 1));
}

kiln_value kiln_cast(kiln_graph *g, kiln_value x, kiln_dtype to) {
    if (!graph_ok_value(g, x, "cast")) return KILN_NONE;
    kiln_dtype from = g->nodes[x].dtype;
    if (to == KILN_BOOL) return from == KILN_BOOL ? x : kiln_binary(g, "ne", x, kiln_scalar(g, 0));
    if (to != KILN_F32 && to != KILN_F64)
        return graph_fail(g, KILN_ERR_INPUT, "cast: to %s is not supported (f32, f64 or bool)",
                          kiln_dtype_name(to));
    if (from == to) return x;
    return pointwise(g, OP_CAST, 1, &x, to);
}

kiln_value kiln_clamp(kiln_graph *g, kiln_value x, int has_min, double min, int has_max,
                      double max) {
    if (!graph_ok_value(g, x, "clamp") || !want_float(g, x, "clamp")) return KILN_NONE;
    if (!has_min && !has_max)
        return graph_fail(g, KILN_ERR_INPUT, "clamp: at least one of min and max is required");
    Node n = node_like(OP_CLAMP, &g->nodes[x]);
    n.dtype = g->nodes[x].dtype;
    n.nin = 1;
    n.in[0] = x;
    n.f[0] = min;
    n.f[1] = max;
    n.flags = (has_min ? NF_HAS_MIN : 0) | (has_max ? NF_HAS_MAX : 0);
    return graph_add(g, &n);
}

/* ---- reductions ----------------------------------------------------------- */

/* Normalize, range-check and sort dims into n->attr; ndims 0 means all. */
static bool reduce_dims(Graph *g, const char *op, const Node *x, int ndims, const int *dims,
                        Node *n) {
    bool seen[KILN_MAX_RANK] = {false};
    if (ndims < 0 || ndims > KILN_MAX_RANK) {
        graph_fail(g, KILN_ERR_INPUT, "%s: %d dims given", op, ndims);
        return false;
    }
    for (int i = 0; i < ndims; i++) {
        int64_t d;
        if (!norm_dim(g, op, x->rank, dims[i], &d)) return false;
        if (x->rank == 0) continue;
        if (seen[d]) {
            graph_fail(g, KILN_ERR_INPUT, "%s: dim %d is given twice", op, (int)d);
            return false;
        }
        seen[d] = true;
    }
    n->nattr = 0;
    for (int d = 0; d < x->rank; d++)
        if (ndims == 0 || dims == NULL || seen[d]) n->attr[n->nattr++] = d;
    return true;
}

static void reduced_shape(const Node *x, Node *n, bool keepdim) {
    n->rank = 0;
    int k = 0;
    for (int d = 0; d < x->rank; d++) {
        bool red = k < n->nattr && n->attr[k] == d;
        if (red) k++;
        if (!red)
            n->shape[n->rank++] = x->shape[d];
        else if (keepdim)
            n->shape[n->rank++] = 1;
    }
}

kiln_value kiln_reduce(kiln_graph *g, const char *opname, kiln_value x, int ndims, const int *dims,
                       int keepdim) {
    int op = op_lookup(opname ? opname : "");
    if (op < 0 || (op_info[op].kind != KIND_REDUCTION && op != OP_MEAN))
        return g->status ? KILN_NONE
                         : graph_fail(g, KILN_ERR_INPUT, "unknown reduction '%s'", opname);
    if (!graph_ok_value(g, x, opname) || !want_float(g, x, opname)) return KILN_NONE;
    Node n = node_like(op, NULL);
    n.dtype = g->nodes[x].dtype;
    n.nin = 1;
    n.in[0] = x;
    if (!reduce_dims(g, opname, &g->nodes[x], dims ? ndims : 0, dims, &n)) return KILN_NONE;
    if (keepdim) n.flags |= NF_KEEPDIM;
    reduced_shape(&g->nodes[x], &n, keepdim);
    return graph_add(g, &n);
}

/* ---- composites ----------------------------------------------------------- */

static int softmax_like(Graph *g, Op op, kiln_value x, int dim) {
    const char *name = op_info[op].name;
    if (!graph_ok_value(g, x, name) || !want_float(g, x, name)) return KILN_NONE;
    Node n = node_like(op, &g->nodes[x]);
    n.dtype = g->nodes[x].dtype;
    int64_t d;
    if (!norm_dim(g, name, g->nodes[x].rank, dim, &d)) return KILN_NONE;
    n.nin = 1;
    n.in[0] = x;
    n.nattr = g->nodes[x].rank ? 1 : 0;
    n.attr[0] = d;
    return graph_add(g, &n);
}

kiln_value kiln_softmax(kiln_graph *g, kiln_value x, int dim) {
    return softmax_like(g, OP_SOFTMAX, x, dim);
}

kiln_value kiln_log_softmax(kiln_graph *g, kiln_value x, int dim) {
    return softmax_like(g, OP_LOG_SOFTMAX, x, dim);
}

static bool same_shape(const Node *a, int rank, const int64_t *shape) {
    if (a->rank != rank) return false;
    for (int i = 0; i < rank; i++)
        if (a->shape[i] != shape[i]) return false;
    return true;
}

/* An optional per-feature parameter must have exactly this shape. */
static bool param_shape(Graph *g, const char *op, const char *what, kiln_value p, int rank,
                        const int64_t *shape) {
    if (p == KILN_NONE) return true;
    if (!want_float(g, p, op)) return false;
    if (same_shape(&g->nodes[p], rank, shape)) return true;
    char want[128], got[128];
    graph_shape_str(want, sizeof want, rank, shape);
    graph_shape_str(got, sizeof got, g->nodes[p].rank, g->nodes[p].shape);
    graph_fail(g, KILN_ERR_INPUT, "%s: %s must have shape %s, got %s", op, what, want, got);
    return false;
}

kiln_value kiln_layer_norm(kiln_graph *g, kiln_value x, int nshape, const int64_t *normalized_shape,
                           kiln_value weight, kiln_value bias, double eps) {
    const char *op = "layer_norm";
    if (!graph_ok_value(g, x, op) || !ok_optional(g, weight, op) || !ok_optional(g, bias, op) ||
        !want_float(g, x, op))
        return KILN_NONE;
    const Node *xn = &g->nodes[x];
    if (nshape < 1 || nshape > xn->rank)
        return graph_fail(g, KILN_ERR_INPUT,
                          "layer_norm: normalized_shape has %d dims but the input has rank %d",
                          nshape, xn->rank);
    const int64_t *tail = xn->shape + xn->rank - nshape;
    for (int i = 0; i < nshape; i++)
        if (normalized_shape[i] != tail[i]) {
            char want[128], got[128];
            graph_shape_str(want, sizeof want, nshape, normalized_shape);
            graph_shape_str(got, sizeof got, xn->rank, xn->shape);
            return graph_fail(g, KILN_ERR_INPUT,
                              "layer_norm: normalized_shape %s does not match the last dims of "
                              "input shape %s",
                              want, got);
        }
    if (!param_shape(g, op, "weight", weight, nshape, normalized_shape) ||
        !param_shape(g, op, "bias", bias, nshape, normalized_shape))
        return KILN_NONE;
    if (!(eps >= 0)) return graph_fail(g, KILN_ERR_INPUT, "layer_norm: eps must be >= 0");
    Node n = node_like(OP_LAYER_NORM, xn);
    n.dtype = xn->dtype;
    n.nin = 3;
    n.in[0] = x;
    n.in[1] = weight;
    n.in[2] = bias;
    n.nattr = nshape;
    memcpy(n.attr, normalized_shape, sizeof(int64_t) * (size_t)nshape);
    n.f[0] = eps;
    n.flags = (weight >= 0 ? NF_LN_WEIGHT : 0) | (bias >= 0 ? NF_LN_BIAS : 0);
    return graph_add(g, &n);
}

kiln_value kiln_batch_norm(kiln_graph *g, kiln_value x, kiln_value mean, kiln_value var,
                           kiln_value weight, kiln_value bias, double eps) {
    const char *op = "batch_norm";
    if (!graph_ok_value(g, x, op) || !graph_ok_value(g, mean, op) || !graph_ok_value(g, var, op) ||
        !ok_optional(g, weight, op) || !ok_optional(g, bias, op) || !want_float(g, x, op))
        return KILN_NONE;
    const Node *xn = &g->nodes[x];
    if (xn->rank < 2)
        return graph_fail(g, KILN_ERR_INPUT,
                          "batch_norm: input must have rank >= 2 (channels at dim 1), got %d",
                          xn->rank);
    int64_t c = xn->shape[1];
    if (!param_shape(g, op, "running_mean", mean, 1, &c) ||
        !param_shape(g, op, "running_var", var, 1, &c) ||
        !param_shape(g, op, "weight", weight, 1, &c) || !param_shape(g, op, "bias", bias, 1, &c))
        return KILN_NONE;
    if (!(eps >= 0)) return graph_fail(g, KILN_ERR_INPUT, "batch_norm: eps must be >= 0");
    Node n = node_like(OP_BATCH_NORM, xn);
    n.dtype = xn->dtype;
    n.nin = 5;
    n.in[0] = x;
    n.in[1] = mean;
    n.in[2] = var;
    n.in[3] = weight;
    n.in[4] = bias;
    n.f[0] = eps;
    return graph_add(g, &n);
}

/* ---- views -------------------------------------------------------------- */

static int view(Graph *g, Op op, kiln_value x, int rank, const int64_t *shape, int nattr,
                const int64_t *attr) {
    Node n = node_like(op, NULL);
    n.dtype = g->nodes[x].dtype;
    n.nin = 1;
    n.in[0] = x;
    n.rank = rank;
    if (rank) memcpy(n.shape, shape, sizeof(int64_t) * (size_t)rank);
    n.nattr = nattr;
    if (nattr) memcpy(n.attr, attr, sizeof(int64_t) * (size_t)nattr);
    return graph_add(g, &n);
}

kiln_value kiln_permute(kiln_graph *g, kiln_value x, int n, const int *dims) {
    if (!graph_ok_value(g, x, "permute")) return KILN_NONE;
    const Node *xn = &g->nodes[x];
    if (n != xn->rank)
        return graph_fail(g, KILN_ERR_INPUT, "permute: %d dims given for a tensor of rank %d", n,
                          xn->rank);
    int64_t perm[KILN_MAX_RANK], shape[KILN_MAX_RANK];
    bool seen[KILN_MAX_RANK] = {false};
    for (int i = 0; i < n; i++) {
        if (!norm_dim(g, "permute", n, dims[i], &perm[i])) return KILN_NONE;
        if (seen[perm[i]])
            return graph_fail(g, KILN_ERR_INPUT, "permute: dim %d repeats", (int)perm[i]);
        seen[perm[i]] = true;
        shape[i] = xn->shape[perm[i]];
    }
    return view(g, OP_PERMUTE, x, n, shape, n, perm);
}

kiln_value kiln_transpose(kiln_graph *g, kiln_value x, int d0, int d1) {
    if (!graph_ok_value(g, x, "transpose")) return KILN_NONE;
    int rank = g->nodes[x].rank;
    int64_t a, b;
    if (!norm_dim(g, "transpose", rank, d0, &a) || !norm_dim(g, "transpose", rank, d1, &b))
        return KILN_NONE;
    int perm[KILN_MAX_RANK];
    for (int i = 0; i < rank; i++) perm[i] = i;
    if (rank) {
        perm[a] = (int)b;
        perm[b] = (int)a;
    }
    const char *saved = g->origin;
    if (!saved) g->origin = "transpose";
    int v = kiln_permute(g, x, rank, perm);
    g->origin = saved;
    return v;
}

kiln_value kiln_reshape(kiln_graph *g, kiln_value x, int n, const int64_t *shape) {
    if (!graph_ok_value(g, x, "reshape")) return KILN_NONE;
    if (n < 0 || n > KILN_MAX_RANK)
        return graph_fail(g, KILN_ERR_INPUT, "reshape: rank %d is not supported", n);
    int64_t out[KILN_MAX_RANK], known = 1, numel = node_numel(&g->nodes[x]);
    int infer = -1;
    for (int i = 0; i < n; i++) {
        out[i] = shape[i];
        if (shape[i] == -1) {
            if (infer >= 0) return graph_fail(g, KILN_ERR_INPUT, "reshape: only one dim may be -1");
            infer = i;
        } else if (shape[i] < 0) {
            return graph_fail(g, KILN_ERR_INPUT,
                              "reshape: dim %d is %lld; dims must not be negative", i,
                              (long long)shape[i]);
        } else if (shape[i] && known > INT64_MAX / shape[i]) {
            return graph_fail(g, KILN_ERR_INPUT, "reshape: shape has too many elements");
        } else {
            known *= shape[i];
        }
    }
    if (infer >= 0 && known == 0) /* numpy: cannot reshape an empty array to an unknown dim */
        return graph_fail(g, KILN_ERR_INPUT,
                          "reshape: dim %d is -1 beside a dim of 0: its size is unknown", infer);
    if (infer >= 0) out[infer] = numel % known == 0 ? numel / known : -1;
    if ((infer >= 0 && out[infer] < 0) || util_numel(n, out) != numel) {
        char a[128], b[128];
        graph_shape_str(a, sizeof a, g->nodes[x].rank, g->nodes[x].shape);
        graph_shape_str(b, sizeof b, n, shape);
        return graph_fail(g, KILN_ERR_INPUT, "reshape: cannot reshape %s (%lld elements) to %s", a,
                          (long long)numel, b);
    }
    return view(g, OP_RESHAPE, x, n, out, n, out);
}

kiln_value kiln_expand(kiln_graph *g, kiln_value x, int n, const int64_t *shape) {
    if (!graph_ok_value(g, x, "expand")) return KILN_NONE;
    const Node *xn = &g->nodes[x];
    if (n < xn->rank || n > KILN_MAX_RANK)
        return graph_fail(g, KILN_ERR_INPUT, "expand: %d sizes given for a tensor of rank %d", n,
                          xn->rank);
    int64_t out[KILN_MAX_RANK];
    for (int i = 0; i < n; i++) {
        int xd = i - (n - xn->rank);
        int64_t have = xd >= 0 ? xn->shape[xd] : 1, want = shape[i];
        if (want == -1 && xd >= 0) want = have;
        if (want < 0 || (have != 1 && have != want)) {
            char a[128], b[128];
            graph_shape_str(a, sizeof a, xn->rank, xn->shape);
            graph_shape_str(b, sizeof b, n, shape);
            return graph_fail(g, KILN_ERR_INPUT, "expand: cannot expand %s to %s", a, b);
        }
        out[i] = want;
    }
    if (util_numel(n, out) < 0)
        return graph_fail(g, KILN_ERR_INPUT, "expand: shape has too many elements");
    return view(g, OP_EXPAND, x, n, out, n, out);
}

/* Python's slice.indices(size): start and end clamped into [0, size] for a
 * positive step, into [-1, size - 1] for a negative one; the length. */
static int64_t slice_indices(int64_t size, int64_t step, int64_t *start, int64_t *end) {
    int64_t lo = step > 0 ? 0 : -1, hi = step > 0 ? size : size - 1;
    int64_t *b[2] = {start, end};
    for (int i = 0; i < 2; i++) {
        if (*b[i] < 0) *b[i] += size;
        if (*b[i] < lo) *b[i] = lo;
        if (*b[i] > hi) *b[i] = hi;
    }
    int64_t span = step > 0 ? *end - *start : *start - *end, st = step > 0 ? step : -step;
    return span > 0 ? (span + st - 1) / st : 0;
}

kiln_value kiln_slice(kiln_graph *g, kiln_value x, int dim, int64_t start, int64_t end,
                      int64_t step) {
    if (!graph_ok_value(g, x, "slice")) return KILN_NONE;
    const Node *xn = &g->nodes[x];
    if (xn->rank == 0) return graph_fail(g, KILN_ERR_INPUT, "slice: cannot slice a scalar");
    int64_t d;
    if (!norm_dim(g, "slice", xn->rank, dim, &d)) return KILN_NONE;
    if (step == 0 || step == INT64_MIN)
        return graph_fail(g, KILN_ERR_INPUT, "slice: step must not be %s",
                          step ? "INT64_MIN" : "0");
    int64_t size = xn->shape[d];
    int64_t len = slice_indices(size, step, &start, &end);
    if (len == 0) { /* an empty result, as in NumPy */
        start = 0;
        end = 0;
        step = 1;
    }
    int64_t shape[KILN_MAX_RANK];
    memcpy(shape, xn->shape, sizeof shape);
    shape[d] = len;
    int64_t attr[4] = {d, start, end, step};
    return view(g, OP_SLICE, x, xn->rank, shape, 4, attr);
}

/* The kept size of a dim for edge and reflect padding, after cropping. */
static bool pad_border_ok(Graph *g, kiln_pad_mode mode, int d, int64_t size, int64_t b, int64_t a) {
    int64_t m = size + (b < 0 ? b : 0) + (a < 0 ? a : 0);
    if (m < 1 && b <= 0 && a <= 0) return true; /* an empty result: nothing is repeated */
    if (size == 0) {
        graph_fail(g, KILN_ERR_INPUT, "pad: dim %d is empty (size 0): there is nothing to %s", d,
                   mode == KILN_PAD_EDGE ? "repeat" : "reflect");
        return false;
    }
    if (m < 1) {
        graph_fail(g, KILN_ERR_INPUT,
                   "pad: cropping %lld of dim %d (size %lld) leaves nothing to %s",
                   (long long)(size - m), d, (long long)size,
                   mode == KILN_PAD_EDGE ? "repeat" : "reflect");
        return false;
    }
    if (mode == KILN_PAD_REFLECT && (b > m - 1 || a > m - 1)) {
        graph_fail(g, KILN_ERR_INPUT,
                   "pad: reflect padding of %lld and %lld needs dim %d to "
                   "have more than that many elements, it has %lld",
                   (long long)b, (long long)a, d, (long long)m);
        return false;
    }
    return true;
}

kiln_value kiln_pad(kiln_graph *g, kiln_value x, kiln_pad_mode mode, int n, const int64_t *before,
                    const int64_t *after, double value) {
    if (!graph_ok_value(g, x, "pad")) return KILN_NONE;
    const Node *xn = &g->nodes[x];
    if ((unsigned)mode > KILN_PAD_REFLECT)
        return graph_fail(g, KILN_ERR_INPUT, "pad: unknown mode %d", (int)mode);
    if (n != xn->rank || (n && (!before || !after)))
        return graph_fail(g, KILN_ERR_INPUT, "pad: %d pad widths given for a tensor of rank %d",
                          before && after ? n : 0, xn->rank);
    if (xn->dtype == KILN_BOOL && mode == KILN_PAD_CONSTANT && value != 0 && value != 1)
        return graph_fail(g, KILN_ERR_INPUT, "pad: a bool tensor pads with 0 or 1, got %g", value);
    Node r = node_like(OP_PAD, xn);
    r.dtype = xn->dtype;
    r.attr[0] = mode;
    for (int d = 0; d < n; d++) {
        if (before[d] < -xn->shape[d] || before[d] > INT32_MAX || after[d] < -xn->shape[d] ||
            after[d] > INT32_MAX)
            return graph_fail(g, KILN_ERR_INPUT,
                              "pad: widths %lld, %lld of dim %d (size %lld) "
                              "are out of range",
                              (long long)before[d], (long long)after[d], d,
                              (long long)xn->shape[d]);
        if (mode != KILN_PAD_CONSTANT &&
            !pad_border_ok(g, mode, d, xn->shape[d], before[d], after[d]))
            return KILN_NONE;
        r.shape[d] = xn->shape[d] + before[d] + after[d];
        r.attr[1 + d] = before[d];
        r.attr[1 + n + d] = after[d];
    }
    if (!check_shape(g, "pad", r.rank, r.shape)) return KILN_NONE;
    r.nattr = 1 + 2 * n;
    r.nin = 1;
    r.in[0] = x;
    r.f[0] = value;
    return graph_add(g, &r);
}

/* One CONCAT node of at most MAX_IN parts (checked by kiln_concat). */
static int concat_node(Graph *g, int n, const kiln_value *xs, int64_t d) {
    Node r = node_like(OP_CONCAT, &g->nodes[xs[0]]);
    r.dtype = g->nodes[xs[0]].dtype;
    r.shape[d] = 0;
    for (int i = 0; i < n; i++) {
        r.in[i] = xs[i];
        r.shape[d] += g->nodes[xs[i]].shape[d];
    }
    r.nin = n;
    r.nattr = 1;
    r.attr[0] = d;
    if (!check_shape(g, "concat", r.rank, r.shape)) return KILN_NONE;
    return graph_add(g, &r);
}

static bool concat_part_ok(Graph *g, const Node *a, const Node *b, int i, int64_t d) {
    bool same = a->rank == b->rank && a->dtype == b->dtype;
    for (int k = 0; same && k < a->rank; k++) same = k == d || a->shape[k] == b->shape[k];
    if (same) return true;
    char sa[128], sb[128];
    graph_shape_str(sa, sizeof sa, a->rank, a->shape);
    graph_shape_str(sb, sizeof sb, b->rank, b->shape);
    graph_fail(g, KILN_ERR_INPUT,
               "concat: part %d is %s%s, part 0 is %s%s: all dims but dim "
               "%lld must match",
               i, kiln_dtype_name(b->dtype), sb, kiln_dtype_name(a->dtype), sa, (long long)d);
    return false;
}

/* More than MAX_IN parts nest: concat(concat(first MAX_IN), rest...). */
kiln_value kiln_concat(kiln_graph *g, int n, const kiln_value *xs, int dim) {
    if (g->status != KILN_OK) return KILN_NONE;
    if (n < 1 || !xs) return graph_fail(g, KILN_ERR_INPUT, "concat: needs at least one value");
    for (int i = 0; i < n; i++)
        if (!graph_ok_value(g, xs[i], "concat")) return KILN_NONE;
    /* f32 parts beside f64 ones become f64, as an op on both would */
    kiln_value promoted[64];
    bool f64 = false, f32 = false;
    for (int i = 0; i < n; i++)
        f64 |= g->nodes[xs[i]].dtype == KILN_F64, f32 |= g->nodes[xs[i]].dtype == KILN_F32;
    if (f64 && f32 && n <= 64) {
        for (int i = 0; i < n; i++)
            promoted[i] = g->nodes[xs[i]].dtype == KILN_F32 ? kiln_cast(g, xs[i], KILN_F64) : xs[i];
        if (g->status != KILN_OK) return KILN_NONE;
        xs = promoted;
    }
    const Node *a = &g->nodes[xs[0]];
    if (a->rank == 0) return graph_fail(g, KILN_ERR_INPUT, "concat: cannot concatenate scalars");
    int64_t d;
    if (!norm_dim(g, "concat", a->rank, dim, &d)) return KILN_NONE;
    for (int i = 1; i < n; i++)
        if (!concat_part_ok(g, a, &g->nodes[xs[i]], i, d)) return KILN_NONE;
    if (n == 1) return xs[0];
    int v = concat_node(g, n < MAX_IN ? n : MAX_IN, xs, d);
    for (int i = MAX_IN; i < n && v >= 0; i += MAX_IN - 1) {
        kiln_value part[MAX_IN] = {v};
        int k = n - i < MAX_IN - 1 ? n - i : MAX_IN - 1;
        memcpy(part + 1, xs + i, sizeof(kiln_value) * (size_t)k);
        v = concat_node(g, k + 1, part, d);
    }
    return v;
}

/* ---- externs -------------------------------------------------------------- */

/* torch.matmul: 1-D operands gain a dim that is removed again afterwards. */
kiln_value kiln_matmul(kiln_graph *g, kiln_value a, kiln_value b) {
    if (!graph_ok_value(g, a, "matmul") || !graph_ok_value(g, b, "matmul") ||
        !want_float(g, a, "matmul") || !want_float(g, b, "matmul"))
        return KILN_NONE;
    Node an = g->nodes[a], bn = g->nodes[b];
    if (an.rank == 0 || bn.rank == 0)
        return graph_fail(g, KILN_ERR_INPUT, "matmul: both operands need at least 1 dim");
    const char *saved = g->origin;
    if (!saved) g->origin = "matmul";
    int a2 = a, b2 = b;
    if (an.rank == 1) {
        int64_t s[2] = {1, an.shape[0]};
        a2 = kiln_reshape(g, a, 2, s);
    }
    if (bn.rank == 1) {
        int64_t s[2] = {bn.shape[0], 1};
        b2 = kiln_reshape(g, b, 2, s);
    }
    g->origin = saved;
    if (a2 < 0 || b2 < 0) return KILN_NONE;
    const Node *A = &g->nodes[a2], *B = &g->nodes[b2];
    int64_t k1 = A->shape[A->rank - 1], k2 = B->shape[B->rank - 2];
    if (k1 != k2) {
        char sa[128], sb[128];
        graph_shape_str(sa, sizeof sa, an.rank, an.shape);
        graph_shape_str(sb, sizeof sb, bn.rank, bn.shape);
        return graph_fail(g, KILN_ERR_INPUT, "matmul: shapes %s and %s do not match (%lld != %lld)",
                          sa, sb, (long long)k1, (long long)k2);
    }
    /* batch dims broadcast like numpy */
    Node n = node_like(OP_MATMUL, NULL);
    Node ba = *A, bb = *B;
    ba.rank -= 2;
    bb.rank -= 2;
    int rank = ba.rank > bb.rank ? ba.rank : bb.rank;
    for (int d = 0; d < rank; d++) {
        int da = d - (rank - ba.rank), db = d - (rank - bb.rank);
        int64_t sa = da >= 0 ? ba.shape[da] : 1, sb = db >= 0 ? bb.shape[db] : 1;
        if (sa != sb && sa != 1 && sb != 1) {
            char s1[128], s2[128];
            graph_shape_str(s1, sizeof s1, an.rank, an.shape);
            graph_shape_str(s2, sizeof s2, bn.rank, bn.shape);
            return graph_fail(g, KILN_ERR_INPUT,
                              "matmul: batch dims of %s and %s cannot be broadcast", s1, s2);
        }
        n.shape[d] = sa == 1 ? sb : sa;
    }
    if (rank + 2 > KILN_MAX_RANK)
        return graph_fail(g, KILN_ERR_INPUT, "matmul: result rank exceeds %d", KILN_MAX_RANK);
    n.rank = rank + 2;
    n.shape[rank] = A->shape[A->rank - 2];
    n.shape[rank + 1] = B->shape[B->rank - 1];
    /* f64 (OpenBLAS's dgemm): an f32 operand beside an f64 one is cast */
    if (g->nodes[a2].dtype == KILN_F64 || g->nodes[b2].dtype == KILN_F64) {
        if (!saved) g->origin = "matmul";
        if (g->nodes[a2].dtype != KILN_F64) a2 = kiln_cast(g, a2, KILN_F64);
        if (g->nodes[b2].dtype != KILN_F64) b2 = kiln_cast(g, b2, KILN_F64);
        g->origin = saved;
        if (a2 < 0 || b2 < 0) return KILN_NONE;
        n.dtype = KILN_F64;
    }
    n.nin = 2;
    n.in[0] = a2;
    n.in[1] = b2;
    int m = graph_add(g, &n);
    if (m < 0 || (an.rank > 1 && bn.rank > 1)) return m;
    /* drop the dims that 1-D operands gained */
    int64_t out[KILN_MAX_RANK];
    int r = 0;
    for (int d = 0; d < n.rank; d++) {
        if (an.rank == 1 && d == n.rank - 2) continue;
        if (bn.rank == 1 && d == n.rank - 1) continue;
        out[r++] = n.shape[d];
    }
    if (!saved) g->origin = "matmul";
    int v = kiln_reshape(g, m, r, out);
    g->origin = saved;
    return v;
}

kiln_conv_params kiln_conv_defaults(void) {
    kiln_conv_params p = {{1, 1}, {0, 0}, {1, 1}, 1};
    return p;
}

kiln_value kiln_conv2d(kiln_graph *g, kiln_value x, kiln_value w, kiln_value bias,
                       const kiln_conv_params *p) {
    const char *op = "conv2d";
    if (!graph_ok_value(g, x, op) || !graph_ok_value(g, w, op) || !ok_optional(g, bias, op) ||
        !want_f32(g, x, op) || !want_f32(g, w, op))
        return KILN_NONE;
    kiln_conv_params d = p ? *p : kiln_conv_defaults();
    const Node *X = &g->nodes[x], *W = &g->nodes[w];
    if (X->rank != 4 || W->rank != 4)
        return graph_fail(g, KILN_ERR_INPUT,
                          "conv2d: input and weight must be 4-D (NCHW, OIHW), got ranks %d and %d",
                          X->rank, W->rank);
    for (int i = 0; i < 2; i++)
        if (d.stride[i] < 1 || d.dilation[i] < 1 || d.padding[i] < 0)
            return graph_fail(g, KILN_ERR_INPUT,
                              "conv2d: stride and dilation must be >= 1 and padding >= 0");
    if (d.groups < 1 || X->shape[1] % d.groups || W->shape[0] % d.groups)
        return graph_fail(g, KILN_ERR_INPUT,
                          "conv2d: groups=%d must divide input channels %lld and output "
                          "channels %lld",
                          d.groups, (long long)X->shape[1], (long long)W->shape[0]);
    if (W->shape[1] * d.groups != X->shape[1])
        return graph_fail(g, KILN_ERR_INPUT,
                          "conv2d: weight expects %lld input channels per group, input has "
                          "%lld channels in %d groups",
                          (long long)W->shape[1], (long long)X->shape[1], d.groups);
    int64_t oc = W->shape[0];
    if (!param_shape(g, op, "bias", bias, 1, &oc)) return KILN_NONE;
    Node n = node_like(OP_CONV2D, NULL);
    n.rank = 4;
    n.shape[0] = X->shape[0];
    n.shape[1] = oc;
    for (int i = 0; i < 2; i++) {
        int64_t span = (int64_t)d.dilation[i] * (W->shape[2 + i] - 1) + 1;
        int64_t o = (X->shape[2 + i] + 2 * (int64_t)d.padding[i] - span);
        if (o < 0)
            return graph_fail(g, KILN_ERR_INPUT,
                              "conv2d: kernel (extent %lld) is larger than the padded input "
                              "(%lld) in dim %d",
                              (long long)span, (long long)(X->shape[2 + i] + 2 * d.padding[i]),
                              2 + i);
        n.shape[2 + i] = o / d.stride[i] + 1;
    }
    n.nin = bias >= 0 ? 3 : 2;
    n.in[0] = x;
    n.in[1] = w;
    n.in[2] = bias;
    int64_t attr[7] = {d.stride[0],   d.stride[1],   d.padding[0], d.padding[1],
                       d.dilation[0], d.dilation[1], d.groups};
    n.nattr = 7;
    memcpy(n.attr, attr, sizeof attr);
    return graph_add(g, &n);
}

/* numpy.take: out = data.shape[:axis] + indices.shape + data.shape[axis+1:].
 * The indices' values are only known at run time, where the extern (and the
 * interpreter) check each one against data.shape[axis]. */
kiln_value kiln_gather(kiln_graph *g, kiln_value data, kiln_value indices, int axis) {
    const char *op = "gather";
    /* f64 indices (an ONNX int64 tensor) go to the library as f32: exact
     * below 2^24, beyond any dim a gather reads */
    if (graph_ok_value(g, indices, op) && g->nodes[indices].dtype == KILN_F64)
        indices = kiln_cast(g, indices, KILN_F32);
    if (!graph_ok_value(g, data, op) || !graph_ok_value(g, indices, op) ||
        !want_float(g, data, op) || !want_f32(g, indices, op))
        return KILN_NONE;
    const Node *D = &g->nodes[data], *I = &g->nodes[indices];
    if (D->rank == 0) return graph_fail(g, KILN_ERR_INPUT, "gather: data must have at least 1 dim");
    /* f64 data goes to the library as pairs of floats: one dim more */
    if (D->dtype == KILN_F64 && D->rank + 1 > KILN_MAX_RANK)
        return graph_fail(g, KILN_ERR_INPUT, "gather: f64 data of rank %d: at most %d", D->rank,
                          KILN_MAX_RANK - 1);
    int64_t ax;
    if (!norm_dim(g, op, D->rank, axis, &ax)) return KILN_NONE;
    if (D->rank - 1 + I->rank > KILN_MAX_RANK)
        return graph_fail(g, KILN_ERR_INPUT, "gather: result rank %d exceeds %d",
                          D->rank - 1 + I->rank, KILN_MAX_RANK);
    Node n = node_like(OP_GATHER, NULL);
    n.dtype = D->dtype;
    for (int d = 0; d < ax; d++) n.shape[n.rank++] = D->shape[d];
    for (int d = 0; d < I->rank; d++) n.shape[n.rank++] = I->shape[d];
    for (int d = (int)ax + 1; d < D->rank; d++) n.shape[n.rank++] = D->shape[d];
    if (D->shape[ax] == 0 && node_numel(&n) > 0)
        return graph_fail(g, KILN_ERR_INPUT,
                          "gather: dim %d of the data is empty: no index is in range", (int)ax);
    n.nin = 2;
    n.in[0] = data;
    n.in[1] = indices;
    n.nattr = 1;
    n.attr[0] = ax;
    return graph_add(g, &n);
}

/* PyTorch's rules: output_padding < stride or < dilation, so it only adds
 * rows the input's last row could have reached. */
static bool conv_t_params_ok(Graph *g, const kiln_conv_transpose_params *d) {
    for (int i = 0; i < 2; i++) {
        if (d->stride[i] < 1 || d->dilation[i] < 1 || d->padding[i] < 0 ||
            d->output_padding[i] < 0) {
            graph_fail(g, KILN_ERR_INPUT,
                       "conv_transpose2d: stride and dilation must be >= 1, "
                       "padding and output_padding >= 0");
            return false;
        }
        if (d->output_padding[i] >= d->stride[i] && d->output_padding[i] >= d->dilation[i]) {
            graph_fail(g, KILN_ERR_INPUT,
                       "conv_transpose2d: output_padding %d must be smaller "
                       "than stride %d or dilation %d (dim %d)",
                       d->output_padding[i], d->stride[i], d->dilation[i], 2 + i);
            return false;
        }
    }
    return true;
}

/* weight (C_in, C_out/groups, kH, kW), as torch.nn.functional.conv_transpose2d. */
kiln_value kiln_conv_transpose2d(kiln_graph *g, kiln_value x, kiln_value w, kiln_value bias,
                                 const kiln_conv_transpose_params *p) {
    const char *op = "conv_transpose2d";
    if (!graph_ok_value(g, x, op) || !graph_ok_value(g, w, op) || !ok_optional(g, bias, op) ||
        !want_f32(g, x, op) || !want_f32(g, w, op))
        return KILN_NONE;
    kiln_conv_transpose_params d =
        p ? *p : (kiln_conv_transpose_params){{1, 1}, {0, 0}, {0, 0}, {1, 1}, 1};
    const Node *X = &g->nodes[x], *W = &g->nodes[w];
    if (X->rank != 4 || W->rank != 4)
        return graph_fail(g, KILN_ERR_INPUT,
                          "conv_transpose2d: input and weight must be 4-D "
                          "(NCHW, C_in x C_out/groups x kH x kW), got ranks %d and %d",
                          X->rank, W->rank);
    if (!conv_t_params_ok(g, &d)) return KILN_NONE;
    if (d.groups < 1 || X->shape[1] % d.groups)
        return graph_fail(g, KILN_ERR_INPUT,
                          "conv_transpose2d: groups=%d must divide input channels %lld", d.groups,
                          (long long)X->shape[1]);
    if (W->shape[0] != X->shape[1])
        return graph_fail(g, KILN_ERR_INPUT,
                          "conv_transpose2d: weight has %lld input channels "
                          "(dim 0), input has %lld",
                          (long long)W->shape[0], (long long)X->shape[1]);
    int64_t oc = W->shape[1] * d.groups;
    if (!param_shape(g, op, "bias", bias, 1, &oc)) return KILN_NONE;
    Node n = node_like(OP_CONV_TRANSPOSE2D, NULL);
    n.rank = 4;
    n.shape[0] = X->shape[0];
    n.shape[1] = oc;
    for (int i = 0; i < 2; i++) {
        int64_t o = (X->shape[2 + i] - 1) * d.stride[i] - 2 * (int64_t)d.padding[i] +
                    (int64_t)d.dilation[i] * (W->shape[2 + i] - 1) + d.output_padding[i] + 1;
        if (o < 1)
            return graph_fail(g, KILN_ERR_INPUT,
                              "conv_transpose2d: output size %lld in dim %d "
                              "is not positive (padding %d too large)",
                              (long long)o, 2 + i, d.padding[i]);
        n.shape[2 + i] = o;
    }
    n.nin = bias >= 0 ? 3 : 2;
    n.in[0] = x;
    n.in[1] = w;
    n.in[2] = bias;
    int64_t attr[9] = {d.stride[0],   d.stride[1],         d.padding[0],
                       d.padding[1],  d.output_padding[0], d.output_padding[1],
                       d.dilation[0], d.dilation[1],       d.groups};
    n.nattr = 9;
    memcpy(n.attr, attr, sizeof attr);
    return graph_add(g, &n);
}

/* ---- pooling --------------------------------------------------------------- */

/* Output size of one pooled dim (PyTorch/ONNX): floor or ceil of
 * (in + pads - extent) / stride, plus 1; with ceil_mode the last window must
 * start inside the input or the left padding. -1 when no window fits. */
static int64_t pool_out(int64_t in, int64_t k, int64_t s, int64_t dil, int64_t pb, int64_t pe,
                        bool ceil_mode) {
    int64_t room = in + pb + pe - (dil * (k - 1) + 1);
    if (room < 0) return -1;
    int64_t out = (ceil_mode ? room + s - 1 : room) / s + 1;
    if (ceil_mode && (out - 1) * s >= in + pb) out--;
    return out;
}

static bool pool_params_ok(Graph *g, const char *op, const Node *xn, const kiln_pool_params *p) {
    if (!p || p->nspatial < 1 || p->nspatial > 3) {
        graph_fail(g, KILN_ERR_INPUT, "%s: nspatial must be 1, 2 or 3, got %d", op,
                   p ? p->nspatial : 0);
        return false;
    }
    if (xn->rank != p->nspatial + 2) {
        graph_fail(g, KILN_ERR_INPUT,
                   "%s: a %d-D pool needs a tensor of rank %d (N, C, "
                   "spatial...), got rank %d",
                   op, p->nspatial, p->nspatial + 2, xn->rank);
        return false;
    }
    for (int i = 0; i < p->nspatial; i++)
        if (p->kernel[i] < 1 || p->stride[i] < 1 || p->dilation[i] < 1 || p->pad_begin[i] < 0 ||
            p->pad_end[i] < 0 || p->kernel[i] > INT32_MAX || p->stride[i] > INT32_MAX ||
            p->dilation[i] > INT32_MAX || p->pad_begin[i] > INT32_MAX ||
            p->pad_end[i] > INT32_MAX) {
            graph_fail(g, KILN_ERR_INPUT,
                       "%s: kernel, stride and dilation must be >= 1 and "
                       "padding >= 0 (spatial dim %d)",
                       op, i);
            return false;
        }
    return true;
}

static int pool(Graph *g, Op op, kiln_value x, const kiln_pool_params *p) {
    const char *name = op_info[op].name;
    if (!graph_ok_value(g, x, name) || !want_float(g, x, name)) return KILN_NONE;
    const Node *xn = &g->nodes[x];
    if (!pool_params_ok(g, name, xn, p)) return KILN_NONE;
    Node r = node_like(op, xn);
    r.dtype = xn->dtype;
    int ns = p->nspatial;
    r.attr[0] = ns;
    for (int i = 0; i < ns; i++) {
        int d = 2 + i;
        r.shape[d] = pool_out(xn->shape[d], p->kernel[i], p->stride[i], p->dilation[i],
                              p->pad_begin[i], p->pad_end[i], p->ceil_mode);
        if (r.shape[d] < 1)
            return graph_fail(g, KILN_ERR_INPUT,
                              "%s: the window (extent %lld) is larger than "
                              "the padded input (%lld) in dim %d",
                              name, (long long)(p->dilation[i] * (p->kernel[i] - 1) + 1),
                              (long long)(xn->shape[d] + p->pad_begin[i] + p->pad_end[i]), d);
        if (xn->shape[d] == 0 && node_numel(xn) == 0 && r.shape[0] && r.shape[1])
            return graph_fail(g, KILN_ERR_INPUT,
                              "%s: dim %d of the input is empty (size 0): its padded windows "
                              "hold only padding",
                              name, d);
        const int64_t v[5] = {p->kernel[i], p->stride[i], p->dilation[i], p->pad_begin[i],
                              p->pad_end[i]};
        for (int k = 0; k < 5; k++) r.attr[1 + k * ns + i] = v[k];
    }
    r.nattr = 1 + 5 * ns;
    r.flags = (p->ceil_mode ? NF_CEIL : 0) | (p->count_include_pad ? NF_COUNT_PAD : 0);
    r.nin = 1;
    r.in[0] = x;
    return graph_add(g, &r);
}

kiln_value kiln_max_pool(kiln_graph *g, kiln_value x, const kiln_pool_params *p) {
    return pool(g, OP_MAX_POOL, x, p);
}

kiln_value kiln_avg_pool(kiln_graph *g, kiln_value x, const kiln_pool_params *p) {
    return pool(g, OP_AVG_POOL, x, p);
}

/* ---- random ------------------------------------------------------------- */

kiln_value kiln_rand_like(kiln_graph *g, kiln_value x, uint64_t seed) {
    if (!graph_ok_value(g, x, "rand_like")) return KILN_NONE;
    Node n = node_like(OP_RAND, &g->nodes[x]); /* x gives the shape only */
    n.seed = seed;
    return graph_add(g, &n);
}

kiln_value kiln_dropout(kiln_graph *g, kiln_value x, double p, uint64_t seed) {
    if (!graph_ok_value(g, x, "dropout") || !want_f32(g, x, "dropout")) return KILN_NONE;
    if (!(p >= 0 && p <= 1))
        return graph_fail(g, KILN_ERR_INPUT, "dropout: p must be in [0, 1], got %g", p);
    Node n = node_like(OP_DROPOUT, &g->nodes[x]);
    n.nin = 1;
    n.in[0] = x;
    n.f[0] = p;
    n.seed = seed;
    return graph_add(g, &n);
}
