/*
 * onnx_shape.c -- shapes and views: Reshape, Flatten, (Un)Squeeze, Transpose,
 * Shape, Size, Constant(OfShape), Range, Concat, Slice, Split, Gather,
 * Expand, Tile, Pad, DepthToSpace / SpaceToDepth, Trilu; on constants
 * they fold, on graph values they are views.
 */
#include "front/front.h"
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- shapes and views ------------------------------------------------------- */

/* x with a new shape: a constant stays one (same data), a graph value is a
 * reshape view. */
static bool reshape_to(OxNode *n, int rank, const int64_t *shape) {
    OxVal *x = ox_in(n, 0);
    if (x->c) {
        OxVal *o = ox_set_const(n, 0, x->type, rank, shape);
        if (!o) return ox_nomem(n);
        memcpy(o->c, x->c, sizeof(double) * (size_t)ox_numel(o));
        return true;
    }
    if (!ox_set_graph(n, 0, kiln_reshape(n->im->g, ox_graph(n, x), rank, shape), x->type))
        return false;
    OxVal *o = ox_out_slot(n, 0); /* the same values: still affine */
    if (o && (x->affine || ox_is_int_type(x->type))) {
        o->affine = true;
        o->base = x->affine ? x->base : x->v;
        o->off = x->affine ? x->off : 0;
    }
    return true;
}

static bool op_reshape(OxNode *n) {
    int64_t s[KILN_MAX_RANK + 1];
    if (!ox_need_in(n, 0)) return false;
    OxVal *x = ox_in(n, 0);
    int r = n->im->opset < 5 ? ox_attr_ints(n, "shape", s, KILN_MAX_RANK)
                             : ox_const_ints(n, 1, s, KILN_MAX_RANK, "shape");
    if (r < 0)
        return r == -1 && n->im->opset < 5 ? ox_nfail(n, "the shape attribute is required") : false;
    int64_t known = 1, neg = -1;
    for (int i = 0; i < r; i++) {
        if (s[i] == 0 && !ox_attr_i(n, "allowzero", 0)) {
            if (i >= x->rank)
                return ox_nfail(n, "shape entry %d is 0 but the input has rank %d", i, x->rank);
            s[i] = x->shape[i];
        }
        if (s[i] < -1 || s[i] > ((int64_t)1 << 40))
            return ox_nfail(n, "shape entry %d is %lld", i, (long long)s[i]);
        if (s[i] > 0 && known > ((int64_t)1 << 40) / s[i])
            return ox_nfail(n, "the shape has too many elements");
        if (s[i] == -1)
            neg = i;
        else
            known *= s[i];
    }
    if (neg >= 0) s[neg] = known ? ox_numel(x) / known : 0;
    if (util_numel(r, s) != ox_numel(x))
        return ox_nfail(n, "cannot reshape %lld elements to the shape given",
                        (long long)ox_numel(x));
    return reshape_to(n, r, s);
}

static bool op_flatten(OxNode *n) {
    if (!ox_need_in(n, 0)) return false;
    OxVal *x = ox_in(n, 0);
    int64_t axis = ox_attr_i(n, "axis", 1), s[2] = {1, 1};
    if (axis < 0) axis += x->rank;
    if (axis < 0 || axis > x->rank) return ox_nfail(n, "axis is out of range");
    for (int i = 0; i < x->rank; i++) s[i >= axis] *= x->shape[i];
    return reshape_to(n, 2, s);
}

static bool op_squeeze(OxNode *n) {
    if (!ox_need_in(n, 0)) return false;
    OxVal *x = ox_in(n, 0);
    int64_t axes[KILN_MAX_RANK], s[KILN_MAX_RANK];
    int na = ox_get_axes(n, 13, 1, axes, KILN_MAX_RANK), r = 0;
    bool drop[KILN_MAX_RANK] = {false};
    if (na < -1) return false;
    for (int i = 0; i < na; i++) {
        if (!ox_norm_axis(n, &axes[i], x->rank)) return false;
        if (x->shape[axes[i]] != 1) return ox_nfail(n, "dim %lld is not 1", (long long)axes[i]);
        drop[axes[i]] = true;
    }
    for (int i = 0; i < x->rank; i++)
        if (!(na < 0 ? x->shape[i] == 1 : drop[i])) s[r++] = x->shape[i];
    return reshape_to(n, r, s);
}

static bool op_unsqueeze(OxNode *n) {
    if (!ox_need_in(n, 0)) return false;
    OxVal *x = ox_in(n, 0);
    int64_t axes[KILN_MAX_RANK], s[KILN_MAX_RANK];
    int na = ox_get_axes(n, 13, 1, axes, KILN_MAX_RANK);
    if (na < 0) return na == -1 ? ox_nfail(n, "axes are required") : false;
    int r = x->rank + na;
    if (r > KILN_MAX_RANK) return ox_nfail(n, "unsupported: rank %d above 8", r);
    bool add[KILN_MAX_RANK] = {false};
    for (int i = 0; i < na; i++) {
        if (!ox_norm_axis(n, &axes[i], r)) return false;
        add[axes[i]] = true;
    }
    for (int i = 0, k = 0; i < r; i++) s[i] = add[i] ? 1 : x->shape[k++];
    return reshape_to(n, r, s);
}

static bool op_transpose(OxNode *n) {
    if (!ox_need_in(n, 0)) return false;
    OxVal *x = ox_in(n, 0);
    int64_t perm[KILN_MAX_RANK];
    int np = ox_attr_ints(n, "perm", perm, KILN_MAX_RANK), p[KILN_MAX_RANK];
    if (np < -1) return false;
    for (int i = 0; i < x->rank; i++) p[i] = np < 0 ? x->rank - 1 - i : (int)perm[i];
    if (np >= 0 && np != x->rank)
        return ox_nfail(n, "perm has %d entries for rank %d", np, x->rank);
    bool seen[KILN_MAX_RANK] = {false};
    for (int i = 0; i < x->rank; i++) {
        if (p[i] < 0 || p[i] >= x->rank || seen[p[i]])
            return ox_nfail(n, "perm is not a permutation of 0 to %d", x->rank - 1);
        seen[p[i]] = true;
    }
    if (x->c) { /* a constant (shape arithmetic): permuted here, stays one */
        int64_t os[KILN_MAX_RANK], stride[KILN_MAX_RANK], idx[KILN_MAX_RANK] = {0};
        for (int i = 0; i < x->rank; i++) os[i] = x->shape[p[i]];
        for (int i = x->rank - 1, s = 1; i >= 0; s *= (int)x->shape[i], i--) stride[i] = s;
        OxVal *o = ox_set_const(n, 0, x->type, x->rank, os);
        if (!o) return ox_nomem(n);
        for (int64_t k = 0; k < ox_numel(o); k++, ox_next_index(x->rank, os, idx)) {
            int64_t at = 0;
            for (int i = 0; i < x->rank; i++) at += idx[i] * stride[p[i]];
            o->c[k] = x->c[at];
        }
        return true;
    }
    return ox_set_graph(n, 0, kiln_permute(n->im->g, ox_gin(n, 0), x->rank, p), x->type);
}

/* Shape of any value is known at import: every kiln shape is static. */
static bool op_shape(OxNode *n) {
    if (!ox_need_in(n, 0)) return false;
    OxVal *x = ox_in(n, 0);
    int64_t start = ox_attr_i(n, "start", 0), end = ox_attr_i(n, "end", x->rank);
    if (start < 0) start += x->rank;
    if (end < 0) end += x->rank;
    start = start < 0 ? 0 : start > x->rank ? x->rank : start;
    end = end < start ? start : end > x->rank ? x->rank : end;
    int64_t len = end - start;
    OxVal *o = ox_set_const(n, 0, OT_INT64, 1, &len);
    if (!o) return ox_nomem(n);
    for (int64_t i = 0; i < len; i++) o->c[i] = (double)x->shape[start + i];
    return true;
}

static bool op_size(OxNode *n) {
    if (!ox_need_in(n, 0)) return false;
    OxVal *o = ox_set_const(n, 0, OT_INT64, 0, NULL);
    if (!o) return ox_nomem(n);
    o->c[0] = (double)ox_numel(ox_in(n, 0));
    return true;
}

static bool op_constant(OxNode *n) {
    const Onnx__AttributeProto *a = n->n->n_attribute ? n->n->attribute[0] : NULL;
    if (!a || !a->name) return ox_nfail(n, "no value attribute");
    if (!strcmp(a->name, "value") && a->t) {
        OxVal *o = ox_out_slot(n, 0);
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
    if (!ints && !floats) return ox_nfail(n, "unsupported: constant attribute %s", a->name);
    bool scalar = !strcmp(a->name, "value_int") || !strcmp(a->name, "value_float");
    int64_t len = scalar ? 1 : (int64_t)(ints ? a->n_ints : a->n_floats);
    OxVal *o = ox_set_const(n, 0, ints ? OT_INT64 : OT_FLOAT, scalar ? 0 : 1, &len);
    if (!o) return ox_nomem(n);
    for (int64_t i = 0; i < len; i++)
        o->c[i] = scalar ? (ints ? (double)a->i : a->f) : ints ? (double)a->ints[i] : a->floats[i];
    return true;
}

static bool op_constant_of_shape(OxNode *n) {
    int64_t s[KILN_MAX_RANK];
    int r = ox_const_ints(n, 0, s, KILN_MAX_RANK, "shape");
    if (r < 0) return false;
    int64_t m = util_numel(r, s);
    for (int i = 0; i < r; i++) m = s[i] < 0 ? -1 : m;
    if (m < 0 || m > ((int64_t)1 << 31))
        return ox_nfail(n, "the shape has too many elements or a negative dim");
    const Onnx__AttributeProto *a = ox_attr(n, "value");
    OxVal v = {.type = OT_FLOAT};
    double zero = 0;
    v.c = &zero;
    if (a && a->t && !ox_tensor_const(n->im, a->t, &v)) return false;
    if (ox_numel(&v) != 1) return ox_nfail(n, "the value must have one element");
    OxVal *o = ox_set_const(n, 0, v.type, r, s);
    if (!o) return ox_nomem(n);
    for (int64_t i = 0; i < ox_numel(o); i++) o->c[i] = v.c[0];
    return true;
}

static bool op_range(OxNode *n) {
    if (!ox_in(n, 0) || !ox_in(n, 1) || !ox_in(n, 2) || !ox_known(ox_in(n, 0)) ||
        !ox_known(ox_in(n, 1)) || !ox_known(ox_in(n, 2)))
        return ox_nfail(n, "unsupported: start, limit and delta are computed at run time (kiln's "
                           "shapes are static)");
    double st = ox_known(ox_in(n, 0))[0], lim = ox_known(ox_in(n, 1))[0],
           d = ox_known(ox_in(n, 2))[0];
    double cnt = d == 0 ? 0 : fmax(ceil((lim - st) / d), 0);
    if (!(cnt <= 1 << 30)) return ox_nfail(n, "the range has too many elements");
    int64_t len = (int64_t)cnt;
    OxVal *o = ox_set_const(n, 0, ox_in(n, 0)->type, 1, &len);
    if (!o) return ox_nomem(n);
    for (int64_t i = 0; i < len; i++)
        o->c[i] = ox_in(n, 0)->type == OT_FLOAT ? (float)(st + (double)i * d) : st + (double)i * d;
    return true;
}

/* Concat of constants: copy blocks along the axis. */
static bool concat_const(OxNode *n, int64_t axis) {
    OxVal *x0 = ox_in(n, 0);
    int64_t s[KILN_MAX_RANK], outer = 1, total = 0;
    for (int i = 0; i < x0->rank; i++) s[i] = x0->shape[i];
    for (int k = 0; k < n->nin; k++) total += ox_in(n, k)->shape[axis];
    s[axis] = total;
    for (int i = 0; i < axis; i++) outer *= s[i];
    OxVal *o = ox_set_const(n, 0, x0->type, x0->rank, s);
    if (!o) return ox_nomem(n);
    double *p = o->c;
    for (int64_t b = 0; b < outer; b++)
        for (int k = 0; k < n->nin; k++) {
            int64_t blk = ox_numel(ox_in(n, k)) / (outer ? outer : 1);
            memcpy(p, ox_in(n, k)->c + b * blk, sizeof(double) * (size_t)blk);
            p += blk;
        }
    return true;
}

static bool op_concat(OxNode *n) {
    if (n->nin < 1 || !ox_need_in(n, 0)) return ox_nfail(n, "no inputs");
    int64_t axis = ox_attr_i(n, "axis", n->im->opset < 4 ? 1 : 0);
    if (!ox_norm_axis(n, &axis, ox_in(n, 0)->rank)) return false;
    for (int k = 0; k < n->nin; k++) {
        if (!ox_need_in(n, k)) return false;
        if (ox_in(n, k)->rank != ox_in(n, 0)->rank)
            return ox_nfail(n, "inputs have different ranks");
    }
    if (ox_all_const(n)) return concat_const(n, axis);
    kiln_value *xs = arena_alloc(&n->im->arena, sizeof(kiln_value) * (size_t)n->nin);
    if (!xs) return ox_nomem(n);
    int m = 0;
    for (int k = 0; k < n->nin; k++)
        if (ox_numel(ox_in(n, k)) > 0 && (xs[m++] = ox_gin(n, k)) < 0) return false;
    kiln_value y = m == 1 ? xs[0] : kiln_concat(n->im->g, m, xs, (int)axis);
    return ox_set_graph(n, 0, y, ox_in(n, 0)->type);
}

/* ONNX Slice bounds (clamped per its rules) -> kiln_slice arguments. */
static bool slice_dim(OxNode *n, kiln_value *x, OxVal *xv, int64_t axis, int64_t st, int64_t en,
                      int64_t step, int64_t *outlen) {
    int64_t d = xv->shape[axis];
    if (step == 0) return ox_nfail(n, "a step is 0");
    if (d == 0) { /* nothing to slice: empty again */
        *outlen = 0;
        if (x) *x = kiln_slice(n->im->g, *x, (int)axis, 0, 0, 1);
        return true;
    }
    if (step > d) step = d; /* one element either way; keeps -step defined */
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
        if (en == -1) en = -d - 1; /* Python: before the first element */
    }
    if (x) *x = kiln_slice(n->im->g, *x, (int)axis, st, en, step);
    return true;
}

static bool slice_params(OxNode *n, int64_t *st, int64_t *en, int64_t *ax, int64_t *sp, int *cnt) {
    int rank = ox_in(n, 0)->rank, c;
    if (n->im->opset < 10) {
        c = ox_attr_ints(n, "starts", st, KILN_MAX_RANK);
        if (c < 0 || ox_attr_ints(n, "ends", en, KILN_MAX_RANK) != c)
            return ox_nfail(n, "starts and ends are required");
        if (ox_attr_ints(n, "axes", ax, KILN_MAX_RANK) < 0)
            for (int i = 0; i < c; i++) ax[i] = i;
        for (int i = 0; i < c; i++) sp[i] = 1;
    } else {
        c = ox_const_ints(n, 1, st, KILN_MAX_RANK, "starts");
        if (c < 0 || ox_const_ints(n, 2, en, KILN_MAX_RANK, "ends") != c)
            return c < 0 ? false : ox_nfail(n, "starts and ends differ in length");
        if (!ox_in(n, 3))
            for (int i = 0; i < c; i++) ax[i] = i;
        else if (ox_const_ints(n, 3, ax, KILN_MAX_RANK, "axes") != c)
            return false;
        if (!ox_in(n, 4))
            for (int i = 0; i < c; i++) sp[i] = 1;
        else if (ox_const_ints(n, 4, sp, KILN_MAX_RANK, "steps") != c)
            return false;
    }
    for (int i = 0; i < c; i++)
        if (!ox_norm_axis(n, &ax[i], rank)) return false;
    *cnt = c;
    return true;
}

/* Slicing a constant: gather element by element. */
static bool slice_const(OxNode *n, const int64_t *first, const int64_t *step, const int64_t *len) {
    OxVal *x = ox_in(n, 0);
    OxVal *o = ox_set_const(n, 0, x->type, x->rank, len);
    int64_t idx[KILN_MAX_RANK] = {0};
    if (!o) return ox_nomem(n);
    for (int64_t i = 0; i < ox_numel(o); i++, ox_next_index(x->rank, len, idx)) {
        int64_t off = 0;
        for (int d = 0; d < x->rank; d++) off = off * x->shape[d] + first[d] + idx[d] * step[d];
        o->c[i] = x->c[off];
    }
    return true;
}

/* A Slice whose start is computed at run time along one axis, with an end
 * that is the start plus a known length (both affine in one value: a Loop
 * body's x[i:i+1]): a gather of start + 0..len-1. ONNX clamps a slice
 * that runs off the data, making it shorter; kiln's shapes are static, so
 * such a run is an error (the gather's index out of range). A negative
 * start counts from the end when the whole slice does. Step 1 only. */
static bool slice_runtime(OxNode *n, bool *done) {
    OxVal *x = ox_in(n, 0), *s = ox_in(n, 1), *e = ox_in(n, 2), *a = ox_in(n, 3), *p = ox_in(n, 4);
    *done = false;
    if (n->im->opset < 10 || !s || !e || (ox_known(s) && ox_known(e)) || ox_numel(s) != 1 ||
        ox_numel(e) != 1)
        return true;
    bool sa = s->affine || (!ox_known(s) && s->v >= 0),
         ea = e->affine || (!ox_known(e) && e->v >= 0);
    kiln_value sb = s->affine ? s->base : s->v, eb = e->affine ? e->base : e->v;
    if (!sa || !ea || sb != eb || (a && !ox_known(a)) ||
        (p && (!ox_known(p) || ox_known(p)[0] != 1)))
        return true;
    int64_t ax = a ? ox_to_i64(ox_known(a)[0]) : 0;
    if (!ox_norm_axis(n, &ax, x->rank)) return false;
    double soff = s->affine ? s->off : 0, eoff = e->affine ? e->off : 0;
    int64_t len = (int64_t)(eoff - soff), dim = x->shape[ax];
    if (len < 1 || len > dim)
        return ox_nfail(n,
                        "unsupported: a slice of %lld elements computed at run time along an "
                        "axis of %lld",
                        (long long)len, (long long)dim);
    Graph *g = n->im->g;
    float *r;
    int64_t L = len;
    char name[64];
    kiln_value ramp = graph_weight_alloc(g, ox_unnamed(n->im, name, sizeof name), 1, &L, &r);
    if (ramp < 0) return false;
    for (int64_t i = 0; i < len; i++) r[i] = (float)(i + soff);
    int64_t one = 1;
    kiln_value st = kiln_reshape(g, kiln_cast(g, sb, KILN_F32), 1, &one);
    kiln_value start = kiln_binary(g, "add", st, kiln_scalar(g, soff));
    kiln_value idx = kiln_binary(g, "add", st, ramp);
    /* a negative start counts from the end when its end is negative too;
     * with an end of 0 or more (-1 to 0 is empty in ONNX, as in Python) the
     * slice is not len long: an index past the data */
    kiln_value neg = kiln_binary(g, "lt", start, kiln_scalar(g, 0));
    idx = kiln_where(g, neg, kiln_binary(g, "add", idx, kiln_scalar(g, (double)dim)), idx);
    kiln_value cross = kiln_binary(
        g, "ge", kiln_binary(g, "add", start, kiln_scalar(g, (double)len)), kiln_scalar(g, 0));
    idx = kiln_where(g, kiln_where(g, neg, cross, neg), kiln_scalar(g, (double)dim), idx);
    kiln_value y = kiln_gather(g, ox_graph(n, x), idx, (int)ax);
    *done = true;
    graph_note(g,
               "onnx: Slice '%s' (node %d): its start is computed at run time and its length "
               "is %lld: a gather",
               n->n->name ? n->n->name : "", n->index, (long long)len);
    return ox_set_graph(n, 0, y, x->type);
}

static bool op_slice(OxNode *n) {
    if (!ox_need_in(n, 0)) return false;
    OxVal *x = ox_in(n, 0);
    bool done, ok = slice_runtime(n, &done);
    if (!ok || done) return ok;
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
    return ox_set_graph(n, 0, v, x->type);
}

static bool op_split(OxNode *n) {
    if (!ox_need_in(n, 0)) return false;
    OxVal *x = ox_in(n, 0);
    int64_t axis = ox_attr_i(n, "axis", 0), sizes[64];
    int nout = (int)n->n->n_output, ns;
    if (!ox_norm_axis(n, &axis, x->rank)) return false;
    if (nout > 64) return ox_nfail(n, "too many outputs");
    bool from_input = n->im->opset >= 13 && ox_in(n, 1);
    ns = n->im->opset < 13 ? ox_attr_ints(n, "split", sizes, 64)
         : from_input      ? ox_const_ints(n, 1, sizes, 64, "split")
                           : -1;
    if (ns < -1 || (from_input && ns < 0)) return false;
    if (nout < 1) return ox_nfail(n, "no outputs");
    /* opset 18: num_outputs (or split, not both); the last part is smaller
     * when the dim does not divide, as without either before */
    int64_t parts = n->im->opset >= 18 ? ox_attr_i(n, "num_outputs", 0) : 0;
    if (parts && from_input) return ox_nfail(n, "split and num_outputs are both given");
    if (parts && parts != nout)
        return ox_nfail(n, "num_outputs is %lld for %d outputs", (long long)parts, nout);
    if (n->im->opset >= 18 && !parts && !from_input)
        return ox_nfail(n, "needs the split input or num_outputs (opset 18)");
    for (int k = 0; k < ns; k++)
        if (sizes[k] < 0 || sizes[k] > x->shape[axis])
            return ox_nfail(n, "split size %lld is out of range", (long long)sizes[k]);
    if (ns < 0) {
        int64_t d = x->shape[axis], each = (d + nout - 1) / nout;
        for (int k = 0; k < nout; k++) sizes[k] = k < nout - 1 ? each : d - each * (nout - 1);
    } else if (ns != nout) {
        return ox_nfail(n, "split has %d sizes for %d outputs", ns, nout);
    }
    int64_t at = 0;
    for (int k = 0; k < nout; k++) {
        kiln_value v = ox_graph(n, x);
        int64_t len;
        if (ox_out_slot(n, k) && !slice_dim(n, &v, x, axis, at, at + sizes[k], 1, &len))
            return false;
        if (ox_out_slot(n, k) && !ox_set_graph(n, k, v, x->type)) return false;
        at += sizes[k];
    }
    return true;
}

/* Gather of constants: numpy.take on the host. */
static bool gather_const(OxNode *n, int64_t axis) {
    OxVal *x = ox_in(n, 0), *idx = ox_in(n, 1);
    int r = x->rank - 1 + idx->rank;
    int64_t s[KILN_MAX_RANK], outer = 1, inner = 1, m = ox_numel(idx), d = x->shape[axis];
    if (r > KILN_MAX_RANK) return ox_nfail(n, "unsupported: rank above 8");
    for (int i = 0; i < axis; i++) s[i] = x->shape[i], outer *= x->shape[i];
    for (int i = 0; i < idx->rank; i++) s[axis + i] = idx->shape[i];
    for (int i = (int)axis + 1; i < x->rank; i++)
        s[i - 1 + idx->rank] = x->shape[i], inner *= x->shape[i];
    OxVal *o = ox_set_const(n, 0, x->type, r, s);
    if (!o) return ox_nomem(n);
    for (int64_t b = 0; b < outer; b++)
        for (int64_t j = 0; j < m; j++) {
            int64_t k = ox_to_i64(idx->c[j]);
            if (k < 0) k += d;
            if (k < 0 || k >= d)
                return ox_nfail(n, "index %lld is out of range", (long long)idx->c[j]);
            memcpy(o->c + (b * m + j) * inner, x->c + (b * d + k) * inner,
                   sizeof(double) * (size_t)inner);
        }
    return true;
}

static bool op_gather(OxNode *n) {
    if (!ox_need_in(n, 0) || !ox_need_in(n, 1)) return false;
    OxVal *x = ox_in(n, 0), *idx = ox_in(n, 1);
    int64_t axis = ox_attr_i(n, "axis", 0);
    if (!ox_norm_axis(n, &axis, x->rank)) return false;
    if (ox_all_const(n)) return gather_const(n, axis);
    Graph *g = n->im->g;
    if (idx->c && ox_numel(idx) == 1 && idx->rank <= 1) {
        /* one constant index: a slice, then a reshape drops the dim */
        int64_t k = ox_to_i64(idx->c[0]), s[KILN_MAX_RANK], len;
        int r = 0;
        kiln_value v = ox_graph(n, x);
        if (k < -x->shape[axis] || k >= x->shape[axis])
            return ox_nfail(n, "index %lld is out of range", (long long)k);
        if (k < 0) k += x->shape[axis];
        if (!slice_dim(n, &v, x, axis, k, k + 1, 1, &len)) return false;
        for (int i = 0; i < x->rank; i++)
            if (i != axis || idx->rank == 1) s[r++] = i == axis ? 1 : x->shape[i];
        return ox_set_graph(n, 0, kiln_reshape(g, v, r, s), x->type);
    }
    return ox_set_graph(n, 0, kiln_gather(g, ox_graph(n, x), ox_gin(n, 1), (int)axis), x->type);
}

/* GatherElements: y[i] = x[i with i[axis] = idx[i]], idx of x's rank (each
 * dim at most x's, the axis any length). As one gather from the flattened
 * x: flat = base + (idx' - i[axis]) * stride[axis], base the offset of
 * position i in x, idx' the index made non-negative; an index out of
 * [-dim, dim) becomes numel, which the gather reports at run time (rather
 * than reading another row). Constant indices fold into the table. */
static bool op_gather_elements(OxNode *n) {
    if (!ox_need_in(n, 0) || !ox_need_in(n, 1)) return false;
    OxVal *x = ox_in(n, 0), *iv = ox_in(n, 1);
    Graph *g = n->im->g;
    int64_t axis = ox_attr_i(n, "axis", 0);
    if (!ox_norm_axis(n, &axis, x->rank)) return false;
    if (iv->rank != x->rank) return ox_nfail(n, "indices have rank %d, data %d", iv->rank, x->rank);
    int64_t stride[KILN_MAX_RANK], m = ox_numel(iv), total = ox_numel(x), dim = x->shape[axis];
    for (int i = x->rank - 1, s = 1; i >= 0; s *= (int)x->shape[i], i--) stride[i] = s;
    for (int i = 0; i < x->rank; i++)
        if (i != axis && iv->shape[i] > x->shape[i])
            return ox_nfail(n, "indices dim %d is %lld, above the data's %lld", i,
                            (long long)iv->shape[i], (long long)x->shape[i]);
    if (total >= (1 << 24)) return ox_nfail(n, "unsupported: data of 2^24 elements or more");
    double *base = arena_alloc(&n->im->arena, sizeof(double) * (size_t)(m + 1));
    if (!base) return ox_nomem(n);
    int64_t pos[KILN_MAX_RANK] = {0};
    for (int64_t k = 0; k < m; k++, ox_next_index(iv->rank, iv->shape, pos)) {
        double off = 0;
        for (int i = 0; i < x->rank; i++) off += (double)(i == axis ? 0 : pos[i] * stride[i]);
        if (iv->c) { /* constant indices: the table itself */
            double t = iv->c[k] < 0 ? iv->c[k] + (double)dim : iv->c[k];
            off = t < 0 || t >= (double)dim ? (double)total : off + t * (double)stride[axis];
        }
        base[k] = off;
    }
    int64_t flat[1] = {total};
    kiln_value xf = kiln_reshape(g, ox_graph(n, x), 1, flat), table;
    if (iv->c) {
        table = ox_const_tensor(n, iv->rank, iv->shape, base);
    } else {
        kiln_value idx = ox_gin(n, 1), d = ox_sc(g, (double)dim);
        kiln_value t = kiln_where(g, kiln_binary(g, "lt", idx, ox_sc(g, 0)),
                                  kiln_binary(g, "add", idx, d), idx);
        kiln_value at = kiln_binary(g, "add", ox_const_tensor(n, iv->rank, iv->shape, base),
                                    kiln_binary(g, "mul", t, ox_sc(g, (double)stride[axis])));
        kiln_value beyond = ox_sc(g, (double)total);
        table = kiln_where(g, kiln_binary(g, "lt", t, ox_sc(g, 0)), beyond,
                           kiln_where(g, kiln_binary(g, "ge", t, d), beyond, at));
    }
    return ox_set_graph(n, 0, kiln_gather(g, xf, table, 0), x->type);
}

/* GatherND: indices (..., k) pick slices data[b0.., i0, .., ik-1, ...] after
 * batch_dims b leading dims shared with data; output indices.shape[:-1] +
 * data.shape[b + k:]. One gather from the flattened data: each index tuple
 * becomes the flat offset of its slice (computed in the graph, so the
 * indices may be known only at run time), plus the offsets inside the
 * slice; a component outside [-dim, dim) sends the offset out of range,
 * which the gather reports at run time. */
static bool op_gather_nd(OxNode *n) {
    if (!ox_need_in(n, 0) || !ox_need_in(n, 1)) return false;
    Graph *g = n->im->g;
    OxVal *xv = ox_in(n, 0), *iv = ox_in(n, 1);
    int64_t b = ox_attr_i(n, "batch_dims", 0);
    if (iv->rank < 1) return ox_nfail(n, "indices need rank >= 1");
    int64_t k = iv->shape[iv->rank - 1];
    if (b < 0 || b >= iv->rank || b >= xv->rank || k < 1 || b + k > xv->rank)
        return ox_nfail(n, "batch_dims %lld and index tuples of %lld do not fit rank %d",
                        (long long)b, (long long)k, xv->rank);
    for (int i = 0; i < b; i++)
        if (iv->shape[i] != xv->shape[i])
            return ox_nfail(n, "batch dim %d is %lld in the indices, %lld in the data", i,
                            (long long)iv->shape[i], (long long)xv->shape[i]);
    int64_t total = ox_numel(xv), stride[KILN_MAX_RANK], slice = 1;
    if (total >= (1 << 24)) return ox_nfail(n, "unsupported: data of 2^24 elements or more");
    for (int i = xv->rank - 1, s = 1; i >= 0; s *= (int)xv->shape[i], i--) stride[i] = s;
    for (int i = (int)(b + k); i < xv->rank; i++) slice *= xv->shape[i];
    int r1 = iv->rank - 1, orank = r1 + xv->rank - (int)(b + k);
    if (orank + 1 > KILN_MAX_RANK) return ox_nfail(n, "unsupported: rank above 8");
    /* base: the batch part of each tuple's offset; shape indices.shape[:-1] + [1] */
    int64_t bshape[KILN_MAX_RANK], m = 1, pos[KILN_MAX_RANK] = {0};
    for (int i = 0; i < r1; i++) bshape[i] = iv->shape[i], m *= iv->shape[i];
    bshape[r1] = 1;
    double *base = arena_alloc(&n->im->arena, sizeof(double) * (size_t)(m + 1));
    double *inner = arena_alloc(&n->im->arena, sizeof(double) * (size_t)(slice + 1));
    if (!base || !inner) return ox_nomem(n);
    for (int64_t j = 0; j < m; j++, ox_next_index(r1, iv->shape, pos)) {
        base[j] = 0;
        for (int i = 0; i < b; i++) base[j] += (double)(pos[i] * stride[i]);
    }
    for (int64_t e = 0; e < slice; e++) inner[e] = (double)e;
    kiln_value at = ox_const_tensor(n, r1 + 1, bshape, base), idx = ox_gin(n, 1);
    for (int64_t t = 0; t < k; t++) {
        double d = (double)xv->shape[b + t];
        kiln_value c = kiln_slice(g, idx, r1, t, t + 1, 1);
        c = kiln_where(g, kiln_binary(g, "lt", c, ox_sc(g, 0)),
                       kiln_binary(g, "add", c, ox_sc(g, d)), c);
        kiln_value bad = kiln_binary(g, "ge", c, ox_sc(g, d));
        c = kiln_where(g, kiln_binary(g, "lt", c, ox_sc(g, 0)), ox_sc(g, (double)total),
                       kiln_where(g, bad, ox_sc(g, (double)total), c));
        at = kiln_binary(g, "add", at, kiln_binary(g, "mul", c, ox_sc(g, (double)stride[b + t])));
    }
    int64_t ishape[KILN_MAX_RANK], oshape[KILN_MAX_RANK], flat[1] = {total};
    for (int i = 0; i < r1; i++) ishape[i] = 1;
    ishape[r1] = slice;
    kiln_value table = kiln_binary(g, "add", at, ox_const_tensor(n, r1 + 1, ishape, inner));
    kiln_value y = kiln_gather(g, kiln_reshape(g, ox_graph(n, xv), 1, flat), table, 0);
    for (int i = 0; i < r1; i++) oshape[i] = iv->shape[i];
    for (int i = (int)(b + k); i < xv->rank; i++) oshape[r1 + i - b - k] = xv->shape[i];
    return ox_set_graph(n, 0, kiln_reshape(g, y, orank, oshape), xv->type);
}

/* OneHot: y[..., j, ...] = values[1] where trunc(index) (plus depth when
 * negative) is j, else values[0], j along `axis` of the output (rank of
 * indices + 1); an index outside [-depth, depth) gives a row of values[0]. */
static bool op_one_hot(OxNode *n) {
    for (int k = 0; k < 3; k++)
        if (!ox_need_in(n, k)) return false;
    Graph *g = n->im->g;
    OxVal *iv = ox_in(n, 0), *dv = ox_in(n, 1), *vv = ox_in(n, 2);
    const double *dk = ox_known(dv);
    if (!dk || ox_numel(dv) != 1)
        return ox_nfail(n, "unsupported: depth must be one value known at import");
    if (ox_numel(vv) != 2) return ox_nfail(n, "values needs 2 elements (off, on)");
    int64_t depth = (int64_t)dk[0], axis = ox_attr_i(n, "axis", -1);
    int r = iv->rank + 1;
    if (depth < 1 || depth > (1 << 24)) return ox_nfail(n, "depth %g is out of range", dk[0]);
    if (r > KILN_MAX_RANK) return ox_nfail(n, "unsupported: rank above 8");
    if (!ox_norm_axis(n, &axis, r)) return false;
    int64_t ishape[KILN_MAX_RANK], jshape[KILN_MAX_RANK];
    for (int i = 0, k = 0; i < r; i++) {
        ishape[i] = i == axis ? 1 : iv->shape[k];
        jshape[i] = i == axis ? depth : 1;
        if (i != axis) k++;
    }
    double *iota = arena_alloc(&n->im->arena, sizeof(double) * (size_t)depth);
    if (!iota) return ox_nomem(n);
    for (int64_t j = 0; j < depth; j++) iota[j] = (double)j;
    kiln_value idx = ox_gin(n, 0);
    idx = kiln_where(g, kiln_binary(g, "lt", idx, ox_sc(g, 0)), kiln_unary(g, "ceil", idx),
                     kiln_unary(g, "floor", idx)); /* truncated, as a cast to int */
    idx = kiln_where(g, kiln_binary(g, "lt", idx, ox_sc(g, 0)),
                     kiln_binary(g, "add", idx, ox_sc(g, (double)depth)), idx);
    kiln_value hot =
        kiln_binary(g, "eq", kiln_reshape(g, idx, r, ishape), ox_const_tensor(n, r, jshape, iota));
    kiln_value vals = ox_graph(n, vv);
    int64_t one[1] = {1};
    kiln_value off = kiln_reshape(
        g, kiln_slice(g, kiln_reshape(g, vals, 1, (int64_t[]){2}), 0, 0, 1, 1), 0, one);
    kiln_value on = kiln_reshape(
        g, kiln_slice(g, kiln_reshape(g, vals, 1, (int64_t[]){2}), 0, 1, 2, 1), 0, one);
    return ox_set_graph(n, 0, kiln_where(g, hot, on, off), vv->type);
}

/* Expand: bidirectional broadcasting of x with the shape given. */
static bool op_expand(OxNode *n) {
    if (!ox_need_in(n, 0)) return false;
    OxVal *x = ox_in(n, 0);
    int64_t s[KILN_MAX_RANK], out[KILN_MAX_RANK];
    int r = ox_const_ints(n, 1, s, KILN_MAX_RANK, "shape"), orank;
    if (r < 0) return false;
    OxVal sv = {.rank = r};
    memcpy(sv.shape, s, sizeof s);
    OxVal *pair[2] = {x, &sv};
    if (!ox_bcast_shape(n, 2, pair, &orank, out)) return false;
    if (x->c) {
        OxVal *o = ox_set_const(n, 0, x->type, orank, out);
        int64_t idx[KILN_MAX_RANK] = {0};
        if (!o) return ox_nomem(n);
        for (int64_t i = 0; i < ox_numel(o); i++, ox_next_index(orank, out, idx))
            o->c[i] = x->c[ox_bcast_offset(x, orank, idx)];
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
    return ox_set_graph(n, 0, kiln_expand(g, v, orank, out), x->type);
}

/* Tile one dim at a time: (..., d, ...) viewed as (..., 1, d, ...),
 * expanded to (..., r, d, ...), materialized and merged to (..., r*d, ...);
 * one extra dim at a time keeps within kiln's rank limit. */
static kiln_value tile_dim(Graph *g, kiln_value v, int dim, int64_t rep) {
    int r = kiln_value_rank(g, v);
    int64_t s1[KILN_MAX_RANK], s2[KILN_MAX_RANK], s3[KILN_MAX_RANK];
    const int64_t *xs = kiln_value_shape(g, v);
    for (int i = 0, k = 0; i < r; i++) {
        if (i == dim) {
            s1[k] = 1;
            s2[k++] = rep;
        }
        s1[k] = s2[k] = xs[i];
        k++;
        s3[i] = xs[i] * (i == dim ? rep : 1);
    }
    v = kiln_expand(g, kiln_reshape(g, v, r + 1, s1), r + 1, s2);
    return kiln_reshape(g, kiln_unary(g, "contiguous", v), r, s3);
}

static bool op_tile(OxNode *n) {
    if (!ox_need_in(n, 0)) return false;
    OxVal *x = ox_in(n, 0);
    int64_t rep[KILN_MAX_RANK];
    int r = ox_const_ints(n, 1, rep, KILN_MAX_RANK, "repeats");
    if (r < 0) return false;
    if (r != x->rank) return ox_nfail(n, "repeats has %d values for rank %d", r, x->rank);
    Graph *g = n->im->g;
    kiln_value v = ox_graph(n, x);
    for (int i = 0; i < r && v >= 0; i++) {
        if (rep[i] < 0) return ox_nfail(n, "repeats %lld is negative", (long long)rep[i]);
        if (rep[i] == 1) continue;
        if (x->shape[i] && rep[i] > ((int64_t)1 << 40) / x->shape[i])
            return ox_nfail(n, "repeats %lld is too large", (long long)rep[i]);
        if (r == KILN_MAX_RANK) return ox_nfail(n, "unsupported: tiling a rank-6 tensor");
        v = tile_dim(g, v, i, rep[i]);
    }
    return ox_set_graph(n, 0, v, x->type);
}

/* Constant padding with a value known at run time only: pad with 0, and
 * pick the value where a padded all-ones mask is 0. */
static bool pad_runtime_value(OxNode *n, const int64_t *pads, int np) {
    Graph *g = n->im->g;
    OxVal *x = ox_in(n, 0);
    if (np != 2 * x->rank) return ox_nfail(n, "pads has %d values for rank %d", np, x->rank);
    for (int i = 0; i < np; i++)
        if (pads[i] < -((int64_t)1 << 30) || pads[i] > ((int64_t)1 << 30))
            return ox_nfail(n, "pad %lld is out of range", (long long)pads[i]);
    if (!ox_attr_is(n, "mode", "constant", true))
        return ox_nfail(n, "unsupported: pad mode with a value");
    kiln_value y = kiln_pad(g, ox_graph(n, x), KILN_PAD_CONSTANT, x->rank, pads, pads + x->rank, 0);
    kiln_value ones = kiln_expand(
        g, kiln_reshape(g, kiln_scalar(g, 1), x->rank, (int64_t[KILN_MAX_RANK]){1, 1, 1, 1, 1, 1}),
        x->rank, x->shape);
    kiln_value mask = kiln_pad(g, ones, KILN_PAD_CONSTANT, x->rank, pads, pads + x->rank, 0);
    kiln_value inside = kiln_binary(g, "ne", mask, kiln_scalar(g, 0));
    return ox_set_graph(n, 0, kiln_where(g, inside, y, ox_gin(n, 2)), x->type);
}

/* Pad's "wrap" mode (opset 19): along each dim, padded index j reads
 * x[(j - begin) mod size], as numpy.pad's wrap, built as slices of x
 * concatenated (a pad larger than the dim repeats it); negative pads
 * crop first. */
static kiln_value pad_wrap(OxNode *n, kiln_value v, int rank, const int64_t *pads) {
    Graph *g = n->im->g;
    for (int d = 0; d < rank && v >= 0; d++) {
        int64_t b = pads[d], e = pads[rank + d], size = kiln_value_shape(g, v)[d];
        if (b < 0 || e < 0) {
            int64_t lo = b < 0 ? -b : 0, hi = size - (e < 0 ? -e : 0);
            if (hi <= lo) return ox_nfail(n, "negative pads remove all of dim %d", d), KILN_NONE;
            v = kiln_slice(g, v, d, lo, hi, 1);
            size = hi - lo;
            b = b < 0 ? 0 : b, e = e < 0 ? 0 : e;
        }
        if (!b && !e) continue;
        int64_t total = b + size + e, pos = ((-b) % size + size) % size;
        if (total / size + 2 > 64)
            return ox_nfail(n, "wrap pads above 62 times the dim"), KILN_NONE;
        kiln_value parts[64];
        int np = 0;
        for (int64_t left = total; left > 0; pos = 0) {
            int64_t len = size - pos < left ? size - pos : left;
            parts[np++] = kiln_slice(g, v, d, pos, pos + len, 1);
            left -= len;
        }
        v = np == 1 ? parts[0] : kiln_concat(g, np, parts, d);
    }
    return v;
}

/* Pad's pads for every dim: opset 18's axes input (k = 3) names the dims
 * the 2 * len(axes) pads are for; the others get 0. */
static int pad_axes(OxNode *n, int rank, int64_t *pads, int np) {
    int64_t axes[KILN_MAX_RANK], full[2 * KILN_MAX_RANK] = {0};
    int na = ox_const_ints(n, 3, axes, KILN_MAX_RANK, "axes");
    if (na < 0) return na == -1 ? np : -2;
    if (np != 2 * na) return ox_nfail(n, "pads has %d values for %d axes", np, na), -2;
    for (int i = 0; i < na; i++) {
        if (!ox_norm_axis(n, &axes[i], rank)) return -2;
        for (int j = 0; j < i; j++)
            if (axes[j] == axes[i]) return ox_nfail(n, "axis %lld repeats", (long long)axes[i]), -2;
        full[axes[i]] = pads[i];
        full[rank + axes[i]] = pads[na + i];
    }
    memcpy(pads, full, sizeof(int64_t) * 2 * (size_t)rank);
    return 2 * rank;
}

static bool op_pad(OxNode *n) {
    if (!ox_need_in(n, 0)) return false;
    OxVal *x = ox_in(n, 0);
    int64_t pads[2 * KILN_MAX_RANK];
    double value = 0;
    int np;
    if (n->im->opset < 11) {
        np = ox_attr_ints(n, n->im->opset < 2 ? "paddings" : "pads", pads, 2 * KILN_MAX_RANK);
        value = ox_attr_f(n, "value", 0);
    } else {
        np = ox_const_ints(n, 1, pads, 2 * KILN_MAX_RANK, "pads");
        if (np >= 0 && n->im->opset >= 18 && ox_in(n, 3)) np = pad_axes(n, x->rank, pads, np);
        OxVal *cv = ox_in(n, 2);
        if (np >= 0 && cv && !cv->c) return pad_runtime_value(n, pads, np);
        if (cv && cv->c && ox_numel(cv)) value = cv->c[0];
    }
    if (np < 0) return np == -1 ? ox_nfail(n, "pads are required") : false;
    if (np != 2 * x->rank) return ox_nfail(n, "pads has %d values for rank %d", np, x->rank);
    for (int i = 0; i < np; i++)
        if (pads[i] < -((int64_t)1 << 30) || pads[i] > ((int64_t)1 << 30))
            return ox_nfail(n, "pad %lld is out of range", (long long)pads[i]);
    if (n->im->opset >= 19 && ox_attr_is(n, "mode", "wrap", false)) {
        kiln_value y = pad_wrap(n, ox_graph(n, x), x->rank, pads);
        return y >= 0 && ox_set_graph(n, 0, y, x->type);
    }
    kiln_pad_mode mode = ox_attr_is(n, "mode", "edge", false)      ? KILN_PAD_EDGE
                         : ox_attr_is(n, "mode", "reflect", false) ? KILN_PAD_REFLECT
                                                                   : KILN_PAD_CONSTANT;
    if (!ox_attr_is(n, "mode", "constant", true) && mode == KILN_PAD_CONSTANT)
        return ox_nfail(n, "unsupported: pad mode");
    kiln_value y = kiln_pad(n->im->g, ox_graph(n, x), mode, x->rank, pads, pads + x->rank, value);
    return ox_set_graph(n, 0, y, x->type);
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
    OxVal *xv = ox_in(n, 0);
    int64_t b = ox_attr_i(n, "blocksize", 0), *x = xv->shape;
    if (xv->rank != 4 || b < 1 || b > 4096)
        return ox_nfail(n, "needs a rank-4 input and blocksize 1 to 4096");
    kiln_value v = ox_gin(n, 0), y;
    if (!strcmp(ox_opname(n), "SpaceToDepth")) {
        if (x[2] % b || x[3] % b) return ox_nfail(n, "H and W must be multiples of blocksize");
        int64_t s1[6] = {x[0], x[1], x[2] / b, b, x[3] / b, b};
        int64_t s2[4] = {x[0], x[1] * b * b, x[2] / b, x[3] / b};
        y = shuffle(g, v, 6, s1, (int[]){0, 3, 5, 1, 2, 4}, 4, s2);
    } else {
        if (x[1] % (b * b)) return ox_nfail(n, "C must be a multiple of blocksize^2");
        bool crd = ox_attr_is(n, "mode", "CRD", false);
        int64_t c = x[1] / (b * b), s2[4] = {x[0], c, x[2] * b, x[3] * b};
        int64_t dcr[6] = {x[0], b, b, c, x[2], x[3]}, crd6[6] = {x[0], c, b, b, x[2], x[3]};
        y = crd ? shuffle(g, v, 6, crd6, (int[]){0, 1, 4, 2, 5, 3}, 4, s2)
                : shuffle(g, v, 6, dcr, (int[]){0, 3, 4, 1, 5, 2}, 4, s2);
    }
    return ox_set_graph(n, 0, y, xv->type);
}

/* Trilu: x where j - i >= k (upper) or <= k (lower), else 0; the mask a
 * constant over the last two dims. */
static bool op_trilu(OxNode *n) {
    OxVal *xv = ox_in(n, 0);
    int64_t k = 0;
    if (xv->rank < 2) return ox_nfail(n, "needs rank >= 2");
    if (ox_in(n, 1) && ox_const_ints(n, 1, &k, 1, "k") < 0) return false;
    bool upper = ox_attr_i(n, "upper", 1) != 0;
    int64_t h = xv->shape[xv->rank - 2], w = xv->shape[xv->rank - 1];
    OxVal m = {.type = OT_BOOL, .rank = 2, .shape = {h, w}, .v = KILN_NONE};
    if (!(m.c = arena_alloc(&n->im->arena, sizeof(double) * (size_t)(h * w)))) return ox_nomem(n);
    for (int64_t i = 0; i < h; i++)
        for (int64_t j = 0; j < w; j++) m.c[i * w + j] = upper ? j - i >= k : j - i <= k;
    Graph *g = n->im->g;
    kiln_value y = kiln_where(g, ox_materialize(n, &m), ox_gin(n, 0), ox_sc(g, 0));
    return ox_set_graph(n, 0, y, xv->type);
}

/* MeanVarianceNormalization: (x - mean) / sqrt(var) over axes (default
 * 0, 2, 3), with ONNX's epsilon of 1e-9. */
static bool op_mvn(OxNode *n) {
    int64_t axes[KILN_MAX_RANK] = {0, 2, 3};
    int na = ox_attr_ints(n, "axes", axes, KILN_MAX_RANK), dims[KILN_MAX_RANK];
    if (na < -1) return false;
    if (na < 0) na = 3;
    for (int i = 0; i < na; i++) {
        if (!ox_norm_axis(n, &axes[i], ox_in(n, 0)->rank)) return false;
        dims[i] = (int)axes[i];
    }
    kiln_value y = ox_normalize(n->im->g, ox_gin(n, 0), na, dims, 1e-9, NULL, NULL);
    return ox_set_graph(n, 0, y, OT_FLOAT);
}

/* ---- this file's handlers (onnx_ops.c looks ops up here) ---------------- */

const OxHandler ox_shape_ops[] = {
    {"Reshape", op_reshape},
    {"Flatten", op_flatten},
    {"Squeeze", op_squeeze},
    {"Unsqueeze", op_unsqueeze},
    {"Transpose", op_transpose},
    {"Shape", op_shape},
    {"Size", op_size},
    {"Constant", op_constant},
    {"ConstantOfShape", op_constant_of_shape},
    {"Range", op_range},
    {"Concat", op_concat},
    {"Slice", op_slice},
    {"Split", op_split},
    {"Gather", op_gather},
    {"GatherElements", op_gather_elements},
    {"OneHot", op_one_hot},
    {"GatherND", op_gather_nd},
    {"Expand", op_expand},
    {"Tile", op_tile},
    {"Pad", op_pad},
    {"DepthToSpace", op_depth_space},
    {"SpaceToDepth", op_depth_space},
    {"Trilu", op_trilu},
    {"MeanVarianceNormalization", op_mvn},
};
const size_t ox_shape_nops = sizeof ox_shape_ops / sizeof ox_shape_ops[0];
