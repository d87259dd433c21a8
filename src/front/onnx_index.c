/*
 * onnx_index.c -- ONNX ops that are index arithmetic over their input:
 * EyeLike, CumSum, ReverseSequence, TopK, Compress, NonZero, Unique and
 * Det.
 *
 * CumSum and TopK are reductions over a broadcast pair of positions along
 * the axis (j <= i; "j ranks before i"), masked by comparisons of index
 * constants: one fused loop nest each, no n-by-n tensor in memory, n^2
 * work along the axis (linear-time scans are not a kiln primitive).
 * ReverseSequence is one gather at indices computed in the graph, so
 * sequence lengths known only at run time work. Compress and NonZero have
 * an output size that depends on a value: computed when that value is
 * known at import (a constant, or an input given with -i), otherwise
 * refused with a message saying which input to give.
 */
#include "front/front.h"
#include <math.h>
#include <stdio.h>
#include <string.h>

/* Refuse a node whose output size depends on the values of v, which only
 * the run knows; a model input gets the hint to give its value. */
static bool size_from_values(OxNode *n, const OxVal *v, const char *what) {
    bool input = false;
    for (int i = 0; i < kiln_num_inputs(n->im->g) && !input; i++)
        input = !strcmp(kiln_input_name(n->im->g, i), v->name);
    char hint[300] = "";
    if (input) snprintf(hint, sizeof hint, "; give its value: kiln run -i %s=FILE", v->name);
    return ox_nfail(n,
                    "unsupported: the %s '%s' is computed at run time, and the output's size "
                    "depends on its values (kiln's shapes are static%s)",
                    what, v->name, hint);
}

/* EyeLike: ones on diagonal k of a 2-D shape, the input's type (or dtype). */
static bool op_eye_like(OxNode *n) {
    if (!ox_need_in(n, 0)) return false;
    OxVal *x = ox_in(n, 0);
    if (x->rank != 2) return ox_nfail(n, "the input must be 2-D, not rank %d", x->rank);
    int64_t k = ox_attr_i(n, "k", 0);
    int type = (int)ox_attr_i(n, "dtype", x->type);
    OxVal *o = ox_set_const(n, 0, type, 2, x->shape);
    if (!o) return ox_nomem(n);
    for (int64_t i = 0; i < x->shape[0]; i++)
        for (int64_t j = 0; j < x->shape[1]; j++) o->c[i * x->shape[1] + j] = j - i == k;
    return true;
}

/* CumSum: y_i = sum of x_j over j <= i (exclusive: j < i; reverse: j >= i,
 * j > i), as a sum over j of where(mask(j, i), x_j, 0) on the pair layout
 * (..., j, i, ...): x with a dim inserted after the axis, the mask from
 * two index constants. Constants fold here. */
static bool op_cumsum(OxNode *n) {
    if (!ox_need_in(n, 0)) return false;
    OxVal *x = ox_in(n, 0);
    int64_t axis;
    if (ox_const_ints(n, 1, &axis, 1, "axis") != 1)
        return ox_in(n, 1) && ox_known(ox_in(n, 1)) ? ox_nfail(n, "axis must have one value")
                                                    : false;
    if (!ox_norm_axis(n, &axis, x->rank)) return false;
    bool excl = ox_attr_i(n, "exclusive", 0) != 0, rev = ox_attr_i(n, "reverse", 0) != 0;
    int a = (int)axis;
    int64_t len = x->shape[a], inner = 1, outer = 1;
    if (!x->c && !ox_index_fits(n, len, "an axis")) return false;
    for (int i = 0; i < x->rank; i++)
        if (i != a) *(i < a ? &outer : &inner) *= x->shape[i];
    if (x->c) {
        OxVal *o = ox_set_const(n, 0, x->type, x->rank, x->shape);
        if (!o) return ox_nomem(n);
        for (int64_t p = 0; p < outer; p++)
            for (int64_t q = 0; q < inner; q++) {
                double acc = 0;
                for (int64_t t = 0; t < len; t++) {
                    int64_t i = rev ? len - 1 - t : t, at = (p * len + i) * inner + q;
                    if (excl) o->c[at] = acc;
                    acc += x->c[at];
                    if (!excl) o->c[at] = acc;
                }
            }
        return true;
    }
    Graph *g = n->im->g;
    int r = x->rank + 1;
    kiln_value jj = ox_iota(n, r, a, len), ii = ox_iota(n, r, a + 1, len);
    if (jj < 0 || ii < 0) return false;
    const char *cmp = rev ? (excl ? "gt" : "ge") : (excl ? "lt" : "le");
    kiln_value xj = ox_insert_dim(n, x, a + 1);
    kiln_value terms = kiln_where(g, kiln_binary(g, cmp, jj, ii), xj, ox_sc(g, 0));
    int dims[1] = {a};
    return ox_set_graph(n, 0, kiln_reduce(g, "sum", terms, 1, dims, 0), x->type);
}

/* ReverseSequence: along the time axis, the first lens[b] elements of
 * batch b reversed, the rest kept. One gather from x laid out (time,
 * batch, rest) and flattened over (time, batch), at t' * B + b with
 * t' = t < lens[b] ? lens[b] - 1 - t : t, computed in the graph (a length
 * above the time dim is an index out of range, reported by the run). */
static bool op_reverse_sequence(OxNode *n) {
    if (!ox_need_in(n, 0) || !ox_need_in(n, 1)) return false;
    Graph *g = n->im->g;
    OxVal *x = ox_in(n, 0), *lv = ox_in(n, 1);
    int64_t ta = ox_attr_i(n, "time_axis", 0), ba = ox_attr_i(n, "batch_axis", 1);
    if (x->rank < 2) return ox_nfail(n, "the input must have rank 2 or more, not %d", x->rank);
    if (!((ta == 0 && ba == 1) || (ta == 1 && ba == 0)))
        return ox_nfail(n, "time_axis and batch_axis must be 0 and 1 (either way round)");
    int64_t T = x->shape[ta], B = x->shape[ba];
    if (!ox_index_fits(n, T * B, "a time-by-batch plane")) return false;
    if (lv->rank != 1 || lv->shape[0] != B)
        return ox_nfail(n, "sequence_lens must be 1-D of the batch size %lld", (long long)B);
    int perm[KILN_MAX_RANK], r = x->rank;
    for (int i = 0; i < r; i++) perm[i] = i;
    kiln_value xv = ox_gin(n, 0);
    if (ta == 1) perm[0] = 1, perm[1] = 0, xv = kiln_permute(g, xv, r, perm);
    int64_t s[KILN_MAX_RANK];
    s[0] = T * B;
    for (int i = 2; i < r; i++) s[i - 1] = x->shape[i];
    xv = kiln_reshape(g, xv, r - 1, s);
    int64_t ls[2] = {1, B};
    kiln_value L = kiln_reshape(g, ox_gin(n, 1), 2, ls);
    kiln_value tt = ox_iota(n, 2, 0, T), bb = ox_iota(n, 2, 1, B);
    if (tt < 0 || bb < 0) return false;
    kiln_value rev = kiln_binary(g, "sub", kiln_binary(g, "sub", L, ox_sc(g, 1)), tt);
    kiln_value src = kiln_where(g, kiln_binary(g, "lt", tt, L), rev, tt);
    kiln_value idx = kiln_binary(g, "add", kiln_binary(g, "mul", src, ox_sc(g, (double)B)), bb);
    kiln_value y = kiln_gather(g, xv, idx, 0); /* (T, B, rest) */
    if (ta == 1) y = kiln_permute(g, y, r, perm);
    return ox_set_graph(n, 0, y, x->type);
}

/* TopK: the rank of x_i is the count of j ranking before it (larger, or
 * equal at a lower index; smaller for largest = 0), a sum over j on the
 * pair layout (..., i, j, ...); output k is the x_i (and the i) whose rank
 * is k, a sum over i on (..., i, k, ...) with one term not zero. Sorted
 * either way (sorted = 0 allows any order). */
static bool op_topk(OxNode *n) {
    if (!ox_need_in(n, 0)) return false;
    Graph *g = n->im->g;
    OxVal *x = ox_in(n, 0);
    int64_t K = 0, axis = ox_attr_i(n, "axis", -1);
    if (n->im->opset < 10)
        K = ox_attr_i(n, "k", -1);
    else if (ox_const_ints(n, 1, &K, 1, "K") != 1)
        return ox_in(n, 1) && ox_known(ox_in(n, 1)) ? ox_nfail(n, "K must have one value") : false;
    if (!ox_norm_axis(n, &axis, x->rank)) return false;
    int a = (int)axis, r = x->rank + 1;
    int64_t len = x->shape[a];
    if (!ox_index_fits(n, len, "an axis")) return false;
    if (K < 0 || K > len)
        return ox_nfail(n, "K is %lld, outside 0 to the axis' %lld", (long long)K, (long long)len);
    bool largest = ox_attr_i(n, "largest", 1) != 0;
    kiln_value xi = ox_insert_dim(n, x, a + 1), xj = ox_insert_dim(n, x, a);
    kiln_value ii = ox_iota(n, r, a, len), jj = ox_iota(n, r, a + 1, len),
               kk = ox_iota(n, r, a + 1, K);
    if (ii < 0 || jj < 0 || kk < 0) return false;
    kiln_value before = kiln_binary(g, largest ? "gt" : "lt", xj, xi);
    kiln_value eq = kiln_binary(g, "eq", xj, xi);
    kiln_value tie = kiln_where(g, eq, kiln_binary(g, "lt", jj, ii), eq); /* eq and j < i */
    kiln_value one =
        kiln_where(g, before, ox_sc(g, 1), kiln_where(g, tie, ox_sc(g, 1), ox_sc(g, 0)));
    int dj[1] = {a + 1}, di[1] = {a};
    kiln_value rank = kiln_reduce(g, "sum", one, 1, dj, 1); /* (..., i, 1, ...) */
    kiln_value sel = kiln_binary(g, "eq", rank, kk);        /* (..., i, k, ...) */
    kiln_value vals = kiln_reduce(g, "sum", kiln_where(g, sel, xi, ox_sc(g, 0)), 1, di, 0);
    kiln_value idx = kiln_reduce(g, "sum", kiln_where(g, sel, ii, ox_sc(g, 0)), 1, di, 0);
    return ox_set_graph(n, 0, vals, x->type) && ox_set_graph(n, 1, idx, OT_INT64);
}

/* Compress: the slices along axis (or the elements of the flattened
 * input) where condition is true, condition known at import; a condition
 * shorter than the axis drops the rest. */
static bool op_compress(OxNode *n) {
    if (!ox_need_in(n, 0) || !ox_need_in(n, 1)) return false;
    Graph *g = n->im->g;
    OxVal *x = ox_in(n, 0), *cv = ox_in(n, 1);
    const double *c = ox_known(cv);
    if (!c) return size_from_values(n, cv, "condition");
    const Onnx__AttributeProto *ax = ox_attr(n, "axis");
    int64_t axis = ax ? ax->i : 0, m = ox_numel(cv), cnt = 0;
    kiln_value xv = ox_gin(n, 0);
    if (!ax) {
        int64_t flat[1] = {ox_numel(x)};
        xv = kiln_reshape(g, xv, 1, flat);
    } else if (!ox_norm_axis(n, &axis, x->rank))
        return false;
    int64_t dim = ax ? x->shape[axis] : ox_numel(x);
    if (!ox_index_fits(n, dim, "an axis")) return false;
    if (cv->rank != 1 || m > dim)
        return ox_nfail(n, "condition must be 1-D, at most %lld long", (long long)dim);
    double *keep = arena_alloc(&n->im->arena, sizeof(double) * (size_t)(m ? m : 1));
    if (!keep) return ox_nomem(n);
    for (int64_t i = 0; i < m; i++)
        if (c[i] != 0) keep[cnt++] = (double)i;
    kiln_value idx = ox_const_tensor(n, 1, &cnt, keep);
    if (idx < 0) return false;
    return ox_set_graph(n, 0, kiln_gather(g, xv, idx, (int)axis), x->type);
}

/* NonZero: the indices of the non-zero elements, one row per dim, in C
 * order; computed at import from a known input. */
static bool op_nonzero(OxNode *n) {
    if (!ox_need_in(n, 0)) return false;
    OxVal *x = ox_in(n, 0);
    const double *c = ox_known(x);
    if (!c) return size_from_values(n, x, "input");
    int64_t m = ox_numel(x), cnt = 0, idx[KILN_MAX_RANK] = {0};
    for (int64_t k = 0; k < m; k++) cnt += c[k] != 0;
    int rank = x->rank ? x->rank : 1;
    int64_t s[2] = {rank, cnt}, at = 0;
    OxVal *o = ox_set_const(n, 0, OT_INT64, 2, s);
    if (!o) return ox_nomem(n);
    for (int64_t k = 0; k < m; k++, ox_next_index(x->rank, x->shape, idx))
        if (c[k] != 0) {
            for (int d = 0; d < rank; d++) o->c[d * cnt + at] = x->rank ? (double)idx[d] : 0;
            at++;
        }
    return true;
}

/* Unique over slices along an axis (the flattened input without one): a
 * slice is the axis' position k's elements, compared lexicographically. */
typedef struct {
    const double *c;
    int64_t outer, len, inner;
} Slices;

static int slice_cmp(const Slices *s, int64_t a, int64_t b) {
    for (int64_t o = 0; o < s->outer; o++)
        for (int64_t i = 0; i < s->inner; i++) {
            double x = s->c[(o * s->len + a) * s->inner + i],
                   y = s->c[(o * s->len + b) * s->inner + i];
            if (x != y) return x < y ? -1 : 1;
        }
    return 0;
}

/* Unique: computed at import from a constant (or an int input given with
 * -i): Y (the distinct slices, sorted or in first-seen order), indices
 * (each one's first position), inverse_indices (each position's entry in
 * Y) and counts. Otherwise refused: the output's size depends on values. */
static bool op_unique(OxNode *n) {
    if (!ox_need_in(n, 0)) return false;
    OxVal *x = ox_in(n, 0);
    if (!x->c) return size_from_values(n, x, "input");
    const Onnx__AttributeProto *ax = ox_attr(n, "axis");
    bool sorted = ox_attr_i(n, "sorted", 1) != 0;
    int64_t axis = ax ? ax->i : 0;
    if (ax && !ox_norm_axis(n, &axis, x->rank)) return false;
    Slices s = {x->c, 1, ox_numel(x), 1};
    if (ax) {
        s.len = x->shape[axis];
        for (int i = 0; i < x->rank; i++)
            if (i != axis) *(i < axis ? &s.outer : &s.inner) *= x->shape[i];
    }
    int64_t L = s.len, *first = kmalloc(sizeof(int64_t) * (size_t)(2 * L + 1));
    if (!first) return ox_nomem(n);
    int64_t *inv = first + L, m = 0;
    for (int64_t k = 0; k < L; k++) { /* first-seen order: O(L^2) comparisons */
        int64_t u = 0;
        while (u < m && slice_cmp(&s, first[u], k)) u++;
        if (u == m) first[m++] = k;
        inv[k] = u;
    }
    int64_t *ord = kmalloc(sizeof(int64_t) * (size_t)(m + 1)),
            *rank = kmalloc(sizeof(int64_t) * (size_t)(m + 1));
    if (!ord || !rank) return kfree(first), kfree(ord), kfree(rank), ox_nomem(n);
    for (int64_t u = 0; u < m; u++) ord[u] = u;
    if (sorted) /* insertion sort of the distinct slices (m is small where this is used) */
        for (int64_t i = 1; i < m; i++)
            for (int64_t j = i; j > 0 && slice_cmp(&s, first[ord[j - 1]], first[ord[j]]) > 0; j--) {
                int64_t t = ord[j];
                ord[j] = ord[j - 1], ord[j - 1] = t;
            }
    for (int64_t u = 0; u < m; u++) rank[ord[u]] = u;
    int64_t ys[KILN_MAX_RANK];
    int yr = ax ? x->rank : 1;
    for (int i = 0; i < yr; i++) ys[i] = ax ? (i == axis ? m : x->shape[i]) : m;
    OxVal *y = ox_set_const(n, 0, x->type, yr, ys);
    bool ok = y != NULL;
    for (int64_t o = 0; ok && o < s.outer; o++)
        for (int64_t u = 0; u < m; u++)
            for (int64_t i = 0; i < s.inner; i++)
                y->c[(o * m + u) * s.inner + i] = s.c[(o * L + first[ord[u]]) * s.inner + i];
    OxVal *oi = ok && ox_out_slot(n, 1) ? ox_set_const(n, 1, OT_INT64, 1, &m) : NULL;
    OxVal *ov = ok && ox_out_slot(n, 2) ? ox_set_const(n, 2, OT_INT64, 1, &L) : NULL;
    OxVal *oc = ok && ox_out_slot(n, 3) ? ox_set_const(n, 3, OT_INT64, 1, &m) : NULL;
    for (int64_t u = 0; u < m; u++) {
        if (oi) oi->c[u] = (double)first[ord[u]];
        if (oc) oc->c[u] = 0;
    }
    for (int64_t k = 0; k < L; k++) {
        if (ov) ov->c[k] = (double)rank[inv[k]];
        if (oc) oc->c[rank[inv[k]]] += 1;
    }
    kfree(first), kfree(ord), kfree(rank);
    return ok || ox_nomem(n);
}

/* Det of the matrix of elements el[rows][cols] (each a graph value of the
 * batch shape), by cofactors along the first of rows: n! products. */
static kiln_value cofactor_det(Graph *g, kiln_value el[4][4], const int *rows, const int *cols,
                               int m) {
    if (m == 1) return el[rows[0]][cols[0]];
    kiln_value sum = KILN_NONE;
    for (int j = 0; j < m; j++) {
        int sub[4], k = 0;
        for (int c = 0; c < m; c++)
            if (c != j) sub[k++] = cols[c];
        kiln_value t =
            kiln_binary(g, "mul", el[rows[0]][cols[j]], cofactor_det(g, el, rows + 1, sub, m - 1));
        sum = sum < 0 ? t : kiln_binary(g, j % 2 ? "sub" : "add", sum, t);
    }
    return sum;
}

/* Det: the determinant of each [n, n] matrix of the last two dims, n up to
 * 4, by cofactor expansion (pointwise over the batch: one fused loop). */
static bool op_det(OxNode *n) {
    if (!ox_need_in(n, 0)) return false;
    Graph *g = n->im->g;
    OxVal *x = ox_in(n, 0);
    int r = x->rank;
    if (r < 2 || x->shape[r - 1] != x->shape[r - 2])
        return ox_nfail(n, "the input must end in a square matrix");
    int m = (int)x->shape[r - 1];
    if (m > 4)
        return ox_nfail(n, "unsupported: Det of %dx%d matrices (kiln expands up to 4x4)", m, m);
    kiln_value el[4][4];
    int64_t bs[KILN_MAX_RANK];
    for (int i = 0; i < r - 2; i++) bs[i] = x->shape[i];
    for (int i = 0; i < m; i++)
        for (int j = 0; j < m; j++) {
            kiln_value v = kiln_slice(g, ox_gin(n, 0), r - 2, i, i + 1, 1);
            el[i][j] = kiln_reshape(g, kiln_slice(g, v, r - 1, j, j + 1, 1), r - 2, bs);
        }
    int idx[4] = {0, 1, 2, 3};
    return ox_set_graph(n, 0, cofactor_det(g, el, idx, idx, m), x->type);
}

const OxHandler ox_index_ops[] = {
    {"Det", op_det},
    {"Unique", op_unique},
    {"EyeLike", op_eye_like},
    {"CumSum", op_cumsum},
    {"ReverseSequence", op_reverse_sequence},
    {"TopK", op_topk},
    {"Compress", op_compress},
    {"NonZero", op_nonzero},
};
const size_t ox_index_nops = sizeof ox_index_ops / sizeof ox_index_ops[0];
