/*
 * onnx_node.c -- what every ONNX op handler uses: failures, attributes, inputs
 * and outputs (OxVal: a host constant or a graph value), materializing a
 * constant into the graph, and evaluating an elementwise op on constants
 * with broadcasting (the shape arithmetic of exported models folds here).
 */
#include "front/front.h"
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers: failures, attributes, inputs and outputs ---------------------- */

bool ox_nfail(OxNode *n, const char *fmt, ...) {
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    graph_fail(n->im->g, KILN_ERR_INPUT, "%s", msg);
    return false;
}

bool ox_nomem(OxNode *n) {
    graph_fail(n->im->g, KILN_ERR_NOMEM, "out of memory");
    return false;
}

const Onnx__AttributeProto *ox_attr(const OxNode *n, const char *name) {
    for (size_t i = 0; i < n->n->n_attribute; i++)
        if (n->n->attribute[i]->name && !strcmp(n->n->attribute[i]->name, name))
            return n->n->attribute[i];
    return NULL;
}

int64_t ox_attr_i(const OxNode *n, const char *name, int64_t def) {
    const Onnx__AttributeProto *a = ox_attr(n, name);
    return a ? a->i : def;
}

double ox_attr_f(const OxNode *n, const char *name, double def) {
    const Onnx__AttributeProto *a = ox_attr(n, name);
    return a ? a->f : def;
}

/* A string attribute compared with s (absent: def). */
bool ox_attr_is(const OxNode *n, const char *name, const char *s, bool def) {
    const Onnx__AttributeProto *a = ox_attr(n, name);
    if (!a) return def;
    return a->s.len == strlen(s) && !memcmp(a->s.data, s, a->s.len);
}

/* An ints attribute into out (at most max); its count, or -1 when absent. */
int ox_attr_ints(OxNode *n, const char *name, int64_t *out, int max) {
    const Onnx__AttributeProto *a = ox_attr(n, name);
    if (!a) return -1;
    if (a->n_ints > (size_t)max) return ox_nfail(n, "attribute %s has too many values", name), -2;
    for (size_t i = 0; i < a->n_ints; i++) out[i] = a->ints[i];
    return (int)a->n_ints;
}

int ox_attr_floats(OxNode *n, const char *name, double *out, int max) {
    const Onnx__AttributeProto *a = ox_attr(n, name);
    if (!a) return -1;
    if (a->n_floats > (size_t)max) return ox_nfail(n, "attribute %s has too many values", name), -2;
    for (size_t i = 0; i < a->n_floats; i++) out[i] = a->floats[i];
    return (int)a->n_floats;
}

OxVal *ox_in(const OxNode *n, int k) { return k < n->nin ? n->in[k] : NULL; }

bool ox_need_in(OxNode *n, int k) {
    return ox_in(n, k) ? true : ox_nfail(n, "input %d is required", k);
}

const char *ox_opname(const OxNode *n) { return n->n->op_type; }

/* Output k's value slot, or NULL when the model does not use it (or out
 * of memory: the graph's error says so). */
OxVal *ox_out_slot(OxNode *n, int k) {
    if (k >= (int)n->n->n_output || !n->n->output[k][0]) return NULL;
    OxVal *o = ox_val(n->im, n->n->output[k]);
    if (!o) ox_nomem(n);
    return o;
}

bool ox_set_graph(OxNode *n, int k, kiln_value v, int type) {
    if (v < 0) return false;
    /* Handlers name float results OT_FLOAT: an f64 value computed from
     * doubles is a DOUBLE. Integers are f32 or f64 in the graph (f64 where
     * an int32/int64 input or a constant past 2^24 took part), half results
     * f32, a DOUBLE f64. */
    kiln_dtype dt = kiln_value_dtype(n->im->g, v);
    bool doubles = false; /* a DOUBLE input: a float result is a DOUBLE too */
    for (int i = 0; n->in && i < n->nin; i++) doubles |= n->in[i] && n->in[i]->type == OT_DOUBLE;
    if (dt == KILN_F64 && type == OT_FLOAT && doubles) type = OT_DOUBLE;
    if (dt == KILN_F64 && type == OT_FLOAT && !doubles) v = kiln_cast(n->im->g, v, KILN_F32);
    if (dt == KILN_F64 && ox_is_half_type(type)) v = kiln_cast(n->im->g, v, KILN_F32);
    if (dt == KILN_F32 && type == OT_DOUBLE) v = kiln_cast(n->im->g, v, KILN_F64);
    if (v < 0) return false;
    OxVal *o = ox_out_slot(n, k);
    if (!o) return k < (int)n->n->n_output && n->n->output[k][0] ? ox_nomem(n) : true;
    o->type = type;
    o->v = v;
    o->c = NULL;
    o->spec = NULL; /* a slot reused (a Loop's next pass) keeps nothing */
    o->is_seq = false;
    o->affine = false;
    o->rank = kiln_value_rank(n->im->g, v);
    memcpy(o->shape, kiln_value_shape(n->im->g, v), sizeof(int64_t) * (size_t)o->rank);
    return true;
}

/* A new constant for output k (data uninitialized); a scratch value when
 * the output is unused. NULL when out of memory. */
OxVal *ox_set_const(OxNode *n, int k, int type, int rank, const int64_t *shape) {
    OxVal *o = ox_out_slot(n, k);
    if (!o) o = arena_alloc(&n->im->arena, sizeof *o);
    if (!o) return NULL;
    int64_t numel = util_numel(rank, shape);
    if (rank > KILN_MAX_RANK || numel < 0 || numel > ((int64_t)1 << 31)) return NULL;
    o->type = type;
    o->rank = rank;
    if (rank) memmove(o->shape, shape, sizeof(int64_t) * (size_t)rank);
    o->v = KILN_NONE;
    o->spec = NULL;
    o->is_seq = false;
    o->c = arena_alloc(&n->im->arena, sizeof(double) * (size_t)(numel ? numel : 1));
    return o->c ? o : NULL;
}

bool ox_all_const(const OxNode *n) {
    for (int k = 0; k < n->nin; k++)
        if (n->in[k] && !n->in[k]->c) return false;
    return true;
}

bool ox_is_int_type(int t) {
    return t == OT_INT32 || t == OT_INT64 || t == OT_INT8 || t == OT_INT16 || t == OT_UINT8 ||
           t == OT_UINT16 || t == OT_UINT32 || t == OT_UINT64;
}

bool ox_index_fits(OxNode *n, int64_t count, const char *what) {
    return count < ((int64_t)1 << 24) ||
           ox_nfail(n,
                    "unsupported: %s of %lld elements (kiln computes indices in f32, exact below "
                    "2^24)",
                    what, (long long)count);
}

bool ox_is_half_type(int t) { return t == OT_FLOAT16 || t == OT_BFLOAT16; }

bool ox_is_wide_int(int t) {
    return t == OT_INT32 || t == OT_INT64 || t == OT_UINT32 || t == OT_UINT64;
}

static bool graph_type_ok(int t) {
    return t == OT_FLOAT || t == OT_DOUBLE || t == OT_BOOL || ox_is_int_type(t) ||
           ox_is_half_type(t);
}

const char *ox_unnamed(OxImp *im, char *buf, size_t len) {
    util_fmt(buf, len, "onnx:const:%d", im->nconst++);
    return buf;
}

kiln_value ox_const_tensor(OxNode *n, int rank, const int64_t *shape, const double *vals) {
    /* in a node on doubles, its tables (interpolation weights, twiddle
     * factors, windows) are doubles too */
    bool doubles = false;
    for (int i = 0; n->in && i < n->nin; i++) doubles |= n->in[i] && n->in[i]->type == OT_DOUBLE;
    OxVal t = {.type = doubles ? OT_DOUBLE : OT_FLOAT, .rank = rank, .v = KILN_NONE};
    memcpy(t.shape, shape, sizeof(int64_t) * (size_t)rank);
    int64_t m = ox_numel(&t);
    if (!(t.c = arena_alloc(&n->im->arena, sizeof(double) * (size_t)(m ? m : 1))))
        return ox_nomem(n), KILN_NONE;
    memcpy(t.c, vals, sizeof(double) * (size_t)m);
    return ox_materialize(n, &t);
}

kiln_value ox_iota(OxNode *n, int rank, int dim, int64_t len) {
    OxVal iota = {.type = OT_FLOAT, .rank = rank, .v = KILN_NONE};
    for (int i = 0; i < rank; i++) iota.shape[i] = i == dim ? len : 1;
    if (!(iota.c = arena_alloc(&n->im->arena, sizeof(double) * (size_t)(len ? len : 1))))
        return ox_nomem(n), KILN_NONE;
    for (int64_t i = 0; i < len; i++) iota.c[i] = (double)i;
    return ox_materialize(n, &iota);
}

kiln_value ox_insert_dim(OxNode *n, OxVal *x, int at) {
    int64_t s[KILN_MAX_RANK];
    if (x->rank + 1 > KILN_MAX_RANK) return ox_nfail(n, "unsupported: rank above 8"), KILN_NONE;
    for (int i = 0, j = 0; i <= x->rank; i++) s[i] = i == at ? 1 : x->shape[j++];
    return kiln_reshape(n->im->g, ox_graph(n, x), x->rank + 1, s);
}

kiln_value ox_materialize(OxNode *n, OxVal *v) {
    Graph *g = n->im->g;
    int64_t numel = ox_numel(v);
    if (!graph_type_ok(v->type))
        return ox_nfail(n, "unsupported: element type %s in the graph", ox_type_name(v->type)),
               KILN_NONE;
    /* an integer constant past 2^24 is held in f64 (exact to 2^53), and is
     * not a scalar, which an f32 operand would round */
    bool wide = false;
    for (int64_t k = 0; ox_is_int_type(v->type) && k < numel && !wide; k++)
        wide = fabs(v->c[k]) > 16777216.0;
    if (v->rank == 0 && v->type == OT_DOUBLE) return kiln_scalar(g, v->c[0]);
    if (v->rank == 0 && v->type != OT_BOOL && !wide) return kiln_scalar(g, (float)v->c[0]);
    char buf[64], pbuf[300];
    const char *name = v->name && v->name[0] ? v->name : ox_unnamed(n->im, buf, sizeof buf);
    if (n->im->pass) { /* one body's names in every pass */
        util_fmt(pbuf, sizeof pbuf, "%s#%d", name, n->im->pass);
        name = pbuf;
    }
    if (v->type == OT_DOUBLE || wide) /* the doubles as they are */
        return kiln_weight_typed(g, name, KILN_F64, v->rank, v->shape, v->c);
    float *f = NULL; /* converted straight into the weight: no buffer between */
    kiln_value w = graph_weight_alloc(g, name, v->rank, v->shape, &f);
    for (int64_t k = 0; w >= 0 && k < numel; k++) f[k] = (float)v->c[k];
    if (v->type == OT_BOOL) w = kiln_binary(g, "ne", w, kiln_scalar(g, 0));
    return w;
}

kiln_value ox_graph(OxNode *n, OxVal *v) {
    if (v->is_seq)
        return ox_nfail(n, "'%s' is a sequence, where this op takes a tensor",
                        v->name ? v->name : ""),
               KILN_NONE;
    if (v->v >= 0 || !v->c) return v->v;
    return v->v = ox_materialize(n, v);
}

/* A model output that folded to a constant: a weight even at rank 0 (a
 * scalar constant node is not a buffer the runtime can hand out). */
kiln_value ox_graph_output(OxNode *n, OxVal *v) {
    if (v->v >= 0 || !v->c || v->rank > 0 || v->type == OT_BOOL || !graph_type_ok(v->type) ||
        fabs(v->c[0]) > 16777216.0)
        return ox_graph(n, v); /* and its checks */
    float f = (float)v->c[0];
    char buf[64];
    const char *name = v->name && v->name[0] ? v->name : ox_unnamed(n->im, buf, sizeof buf);
    if (v->type == OT_DOUBLE)
        return v->v = kiln_weight_typed(n->im->g, name, KILN_F64, 0, NULL, v->c);
    return v->v = kiln_weight(n->im->g, name, 0, NULL, &f);
}

kiln_value ox_gin(OxNode *n, int k) {
    OxVal *v = ox_in(n, k);
    if (!v) return ox_nfail(n, "input %d is required", k), KILN_NONE;
    return ox_graph(n, v);
}

/* A constant as an integer, saturated (INT64_MAX ends a Slice), NaN 0. */
int64_t ox_to_i64(double d) {
    return isnan(d) ? 0 : d >= 9.2e18 ? INT64_MAX : d <= -9.2e18 ? INT64_MIN : (int64_t)d;
}

/* The values of v where a constant is needed: a constant's, or those of
 * a specialized input; NULL when only the run knows them. */
const double *ox_known(const OxVal *v) { return v->c ? v->c : v->spec; }

/* Constant input k as integers (at most max); its count, or -1 with an error. */
int ox_const_ints(OxNode *n, int k, int64_t *out, int max, const char *what) {
    OxVal *v = ox_in(n, k);
    if (!v) return ox_nfail(n, "the %s input is required", what), -1;
    const double *c = ox_known(v);
    if (!c)
        return ox_nfail(n,
                        "unsupported: the %s input '%s' is computed at run time (kiln's "
                        "shapes are static: give its value, kiln run -i %s=FILE)",
                        what, v->name, v->name),
               -1;
    int64_t m = ox_numel(v);
    if (m > max)
        return ox_nfail(n, "the %s input has %lld values, at most %d", what, (long long)m, max), -1;
    for (int64_t i = 0; i < m; i++) { out[i] = ox_to_i64(c[i]); }
    return (int)m;
}

/* Axes from attribute "axes" (opset < since) or input k; -1 when absent. */
int ox_get_axes(OxNode *n, int since, int k, int64_t *axes, int max) {
    if (n->im->opset < since) return ox_attr_ints(n, "axes", axes, max);
    if (!ox_in(n, k)) return -1;
    return ox_const_ints(n, k, axes, max, "axes");
}

bool ox_norm_axis(OxNode *n, int64_t *a, int rank) {
    if (*a < -rank || *a >= rank)
        return ox_nfail(n, "axis %lld is out of range for rank %d", (long long)*a, rank);
    if (*a < 0) *a += rank;
    return true;
}

/* ---- constant evaluation: broadcasting over up to three operands --------- */

bool ox_bcast_shape(OxNode *n, int nv, OxVal **v, int *rank, int64_t *shape) {
    *rank = 0;
    for (int k = 0; k < nv; k++)
        if (v[k]->rank > *rank) *rank = v[k]->rank;
    for (int d = 0; d < *rank; d++) shape[d] = 1;
    for (int k = 0; k < nv; k++)
        for (int d = 0; d < v[k]->rank; d++) {
            int64_t *o = &shape[*rank - v[k]->rank + d], s = v[k]->shape[d];
            if (s == *o || s == 1) continue;
            if (*o != 1) return ox_nfail(n, "shapes cannot be broadcast");
            *o = s;
        }
    return true;
}

/* Offset in v of the output element with multi-index idx (broadcast). */
int64_t ox_bcast_offset(const OxVal *v, int rank, const int64_t *idx) {
    int64_t off = 0;
    for (int d = 0; d < v->rank; d++) {
        int64_t i = v->shape[d] == 1 ? 0 : idx[rank - v->rank + d];
        off = off * v->shape[d] + i;
    }
    return off;
}

void ox_next_index(int rank, const int64_t *shape, int64_t *idx) {
    for (int d = rank - 1; d >= 0; d--) {
        if (++idx[d] < shape[d]) return;
        idx[d] = 0;
    }
}

/* The two's-complement span and lowest value of an integer type of at most
 * 32 bits; false for the others (64-bit: kept as computed). */
static bool int_span(int type, double *lo, double *span) {
    switch (type) {
    case OT_INT8: *lo = -128, *span = 256; return true;
    case OT_UINT8: *lo = 0, *span = 256; return true;
    case OT_INT16: *lo = -32768, *span = 65536; return true;
    case OT_UINT16: *lo = 0, *span = 65536; return true;
    case OT_INT32: *lo = -2147483648.0, *span = 4294967296.0; return true;
    case OT_UINT32: *lo = 0, *span = 4294967296.0; return true;
    }
    return false;
}

double ox_wrap_int(double r, int type) {
    double lo, span;
    if (!int_span(type, &lo, &span) || !isfinite(r)) return r;
    return r - floor((r - lo) / span) * span;
}

bool ox_is_narrow_int(int type) {
    double lo, span;
    return int_span(type, &lo, &span) && span <= 65536;
}

kiln_value ox_wrap_graph(Graph *g, kiln_value v, int type) {
    double lo, span;
    /* 32-bit types wrap exactly in f64 (a value below 2^53 less a multiple
     * of 2^32); an f32 value is below 2^24, where the wrap is v itself */
    if (!int_span(type, &lo, &span)) return v;
    kiln_value q = kiln_unary(
        g, "floor",
        kiln_binary(g, "mul", kiln_binary(g, "sub", v, ox_sc(g, lo)), ox_sc(g, 1 / span)));
    return kiln_binary(g, "sub", v, kiln_binary(g, "mul", q, ox_sc(g, span)));
}

/* f over the broadcast known values of v[0..nv) into out (m elements). */
static void eval_into(int nv, OxVal **v, EvalFn f, int outtype, int rank, const int64_t *shape,
                      int64_t m, double *out) {
    int64_t idx[KILN_MAX_RANK] = {0};
    for (int64_t i = 0; i < m; i++, ox_next_index(rank, shape, idx)) {
        double a[3] = {0, 0, 0};
        for (int k = 0; k < nv; k++) a[k] = ox_known(v[k])[ox_bcast_offset(v[k], rank, idx)];
        double r = f(a[0], a[1], a[2], v[0]->type);
        out[i] = outtype == OT_DOUBLE     ? r
                 : outtype == OT_FLOAT    ? (double)(float)r
                 : outtype == OT_FLOAT16  ? util_f16_to_f32(util_f32_to_f16((float)r))
                 : outtype == OT_BFLOAT16 ? util_bf16_to_f32(util_f32_to_bf16((float)r))
                                          : ox_wrap_int(r, outtype);
    }
}

/* Output 0, a graph value, also gets its values where every input's are
 * known at import without all being constants (inputs given with -i): the
 * import reads them where it needs a constant (a Loop's trip count
 * computed from float inputs), as it reads a specialized input's. Only for
 * small values (shape arithmetic), so no image is evaluated on the host. */
void ox_spec_eval(OxNode *n, int nv, OxVal **v, EvalFn f, int outtype) {
    OxVal *o = ox_out_slot(n, 0);
    int rank;
    int64_t shape[KILN_MAX_RANK];
    if (!o || o->c || !f) return;
    for (int k = 0; k < nv; k++)
        if (!v[k] || v[k]->is_seq || !ox_known(v[k])) return;
    if (!ox_bcast_shape(n, nv, v, &rank, shape)) {
        graph_clear_error(n->im->g);
        return;
    }
    int64_t m = util_numel(rank, shape);
    if (m < 1 || m > 64 || rank != o->rank ||
        memcmp(shape, o->shape, sizeof(int64_t) * (size_t)rank))
        return;
    if (!(o->spec = arena_alloc(&n->im->arena, sizeof(double) * (size_t)m))) return;
    eval_into(nv, v, f, outtype, rank, shape, m, o->spec);
}

bool ox_eval_const(OxNode *n, int nv, OxVal **v, EvalFn f, int outtype) {
    int rank;
    int64_t shape[KILN_MAX_RANK];
    if (!ox_bcast_shape(n, nv, v, &rank, shape)) return false;
    OxVal *o = ox_set_const(n, 0, outtype, rank, shape);
    if (!o) return ox_nomem(n);
    eval_into(nv, v, f, outtype, rank, shape, ox_numel(o), o->c);
    return true;
}
