/*
 * onnx_seq.c -- ONNX's sequence ops inside a model: SequenceEmpty,
 * SequenceConstruct, SequenceInsert, SequenceErase, SequenceAt,
 * SequenceLength, SplitToSequence and ConcatFromSequence.
 *
 * kiln's shapes are static, so a sequence is a list the importer holds:
 * its length and each element (a constant or a graph value) known at
 * import, positions given as constants (or int inputs given with -i).
 * Nothing of it reaches the graph but its tensors; SequenceAt hands one
 * on, ConcatFromSequence concatenates (or stacks) them, SplitToSequence is
 * slices. A sequence as a model input or output is refused (kiln's inputs
 * and outputs are tensors), and so is a sequence where an op wants a
 * tensor.
 */
#include "front/front.h"
#include <string.h>

enum { CF_SPLIT_MAX = 1024 }; /* the most pieces SplitToSequence makes */

/* Input k as a sequence, or NULL with the error set. */
static OxVal *seq_in(OxNode *n, int k) {
    OxVal *s = ox_in(n, k);
    if (!s) return ox_nfail(n, "input %d is required", k), NULL;
    if (!s->is_seq)
        return ox_nfail(n, "input %d '%s' is a tensor, not a sequence", k, s->name), NULL;
    return s;
}

/* Output 0 as a sequence of m elements (copied from els). */
static bool set_seq(OxNode *n, int type, int m, OxVal *const *els) {
    OxVal *o = ox_out_slot(n, 0);
    if (!o) return true;
    OxVal **e = arena_alloc(&n->im->arena, sizeof(OxVal *) * (size_t)(m + 1));
    if (!e) return ox_nomem(n);
    for (int i = 0; i < m; i++) {
        if (!(e[i] = arena_alloc(&n->im->arena, sizeof(OxVal)))) return ox_nomem(n);
        *e[i] = *els[i];
    }
    const char *name = o->name;
    memset(o, 0, sizeof *o);
    o->name = name;
    o->type = type;
    o->v = KILN_NONE;
    o->is_seq = true;
    o->nseq = m;
    o->seq = e;
    return true;
}

/* A position input (absent: def), in [-len, len] (bound included when
 * insert), made non-negative. -1 with the error set. */
static int64_t position(OxNode *n, int k, int64_t len, int64_t def, bool insert) {
    if (!ox_in(n, k)) return def;
    int64_t p;
    if (ox_const_ints(n, k, &p, 1, "position") != 1)
        return ox_known(ox_in(n, k)) ? (ox_nfail(n, "the position needs one value"), -1) : -1;
    int64_t hi = insert ? len : len - 1;
    if (p < -len || p > hi)
        return ox_nfail(n, "position %lld is outside the sequence of %lld", (long long)p,
                        (long long)len),
               -1;
    return p < 0 ? p + len : p;
}

static bool op_sequence_empty(OxNode *n) {
    return set_seq(n, (int)ox_attr_i(n, "dtype", OT_FLOAT), 0, NULL);
}

static bool op_sequence_construct(OxNode *n) {
    for (int k = 0; k < n->nin; k++) {
        if (!ox_need_in(n, k)) return false;
        if (ox_in(n, k)->is_seq) return ox_nfail(n, "input %d is a sequence, not a tensor", k);
        if (ox_in(n, k)->type != ox_in(n, 0)->type)
            return ox_nfail(n, "the tensors have types %s and %s", ox_type_name(ox_in(n, 0)->type),
                            ox_type_name(ox_in(n, k)->type));
    }
    return set_seq(n, ox_in(n, 0)->type, n->nin, n->in);
}

static bool op_sequence_insert(OxNode *n) {
    OxVal *s = seq_in(n, 0);
    if (!s || !ox_need_in(n, 1)) return false;
    OxVal *t = ox_in(n, 1);
    if (t->is_seq) return ox_nfail(n, "the value to insert is a sequence, not a tensor");
    if (s->nseq && t->type != s->type)
        return ox_nfail(n, "a %s tensor into a sequence of %s", ox_type_name(t->type),
                        ox_type_name(s->type));
    int64_t p = position(n, 2, s->nseq, s->nseq, true);
    if (p < 0) return false;
    OxVal **e = arena_alloc(&n->im->arena, sizeof(OxVal *) * (size_t)(s->nseq + 1));
    if (!e) return ox_nomem(n);
    for (int i = 0, j = 0; i <= s->nseq; i++) e[i] = i == p ? t : s->seq[j++];
    return set_seq(n, s->nseq ? s->type : t->type, s->nseq + 1, e);
}

static bool op_sequence_erase(OxNode *n) {
    OxVal *s = seq_in(n, 0);
    if (!s) return false;
    if (!s->nseq) return ox_nfail(n, "erasing from an empty sequence");
    int64_t p = position(n, 1, s->nseq, s->nseq - 1, false);
    if (p < 0) return false;
    OxVal **e = arena_alloc(&n->im->arena, sizeof(OxVal *) * (size_t)s->nseq);
    if (!e) return ox_nomem(n);
    for (int i = 0, j = 0; i < s->nseq; i++)
        if (i != p) e[j++] = s->seq[i];
    return set_seq(n, s->type, s->nseq - 1, e);
}

static bool op_sequence_at(OxNode *n) {
    OxVal *s = seq_in(n, 0);
    if (!s) return false;
    int64_t p = position(n, 1, s->nseq, -1, false);
    if (p < 0) return ox_in(n, 1) ? false : ox_nfail(n, "the position is required");
    OxVal *o = ox_out_slot(n, 0);
    if (o) {
        const char *name = o->name;
        *o = *s->seq[p];
        o->name = name;
    }
    return true;
}

static bool op_sequence_length(OxNode *n) {
    OxVal *s = seq_in(n, 0);
    if (!s) return false;
    OxVal *o = ox_set_const(n, 0, OT_INT64, 0, NULL);
    if (!o) return ox_nomem(n);
    o->c[0] = s->nseq;
    return true;
}

/* SplitToSequence: split (a scalar: chunks of that size, the last
 * smaller; 1-D: the sizes) along axis, or without it pieces of 1, their
 * axis dropped unless keepdims. */
static bool op_split_to_sequence(OxNode *n) {
    if (!ox_need_in(n, 0)) return false;
    Graph *g = n->im->g;
    OxVal *x = ox_in(n, 0);
    int64_t axis = ox_attr_i(n, "axis", 0), sizes[CF_SPLIT_MAX];
    if (!ox_norm_axis(n, &axis, x->rank)) return false;
    int64_t d = x->shape[axis];
    int m = 0;
    bool keep = true;
    OxVal *sp = ox_in(n, 1);
    if (!sp) {
        keep = ox_attr_i(n, "keepdims", 1) != 0;
        if (d > CF_SPLIT_MAX) return ox_nfail(n, "unsupported: more than %d pieces", CF_SPLIT_MAX);
        for (m = 0; m < d; m++) sizes[m] = 1;
    } else {
        int ns = ox_const_ints(n, 1, sizes, CF_SPLIT_MAX, "split");
        if (ns < 0) return false;
        if (sp->rank == 0) {
            int64_t each = sizes[0];
            if (each < 1) return ox_nfail(n, "split %lld is not positive", (long long)each);
            if ((d + each - 1) / each > CF_SPLIT_MAX)
                return ox_nfail(n, "unsupported: more than %d pieces", CF_SPLIT_MAX);
            for (int64_t at = 0; at < d; at += each) sizes[m++] = at + each <= d ? each : d - at;
        } else {
            int64_t sum = 0;
            for (int i = 0; i < ns; i++) sum += sizes[i];
            if (sum != d)
                return ox_nfail(n, "the split sizes add up to %lld, the dim is %lld",
                                (long long)sum, (long long)d);
            m = ns;
        }
    }
    OxVal *els = arena_alloc(&n->im->arena, sizeof(OxVal) * (size_t)(m + 1));
    OxVal **ep = arena_alloc(&n->im->arena, sizeof(OxVal *) * (size_t)(m + 1));
    if (!els || !ep) return ox_nomem(n);
    for (int i = 0, at = 0; i < m; at += (int)sizes[i], i++) {
        if (sizes[i] < 0) return ox_nfail(n, "split %lld is negative", (long long)sizes[i]);
        int64_t s[KILN_MAX_RANK];
        int r = 0;
        for (int k = 0; k < x->rank; k++)
            if (k != axis || keep) s[r++] = k == axis ? sizes[i] : x->shape[k];
        kiln_value v = kiln_slice(g, ox_graph(n, x), (int)axis, at, at + sizes[i], 1);
        if (!keep) v = kiln_reshape(g, v, r, s);
        els[i] = (OxVal){.name = x->name, .type = x->type, .rank = r, .v = v};
        memcpy(els[i].shape, s, sizeof(int64_t) * (size_t)r);
        if (v < 0) return false;
        ep[i] = &els[i];
    }
    return set_seq(n, x->type, m, ep);
}

/* ConcatFromSequence: the elements concatenated along axis, or with
 * new_axis stacked along a new one (axis then from -rank-1 to rank). */
static bool op_concat_from_sequence(OxNode *n) {
    OxVal *s = seq_in(n, 0);
    if (!s) return false;
    Graph *g = n->im->g;
    if (!s->nseq)
        return ox_nfail(n, "unsupported: an empty sequence concatenates to an empty tensor");
    bool stack = ox_attr_i(n, "new_axis", 0) != 0;
    int r = s->seq[0]->rank;
    int64_t axis = ox_attr_i(n, "axis", 0);
    if (!ox_norm_axis(n, &axis, r + (stack ? 1 : 0))) return false;
    kiln_value *vs = arena_alloc(&n->im->arena, sizeof(kiln_value) * (size_t)s->nseq);
    if (!vs) return ox_nomem(n);
    for (int i = 0; i < s->nseq; i++) {
        OxVal *e = s->seq[i];
        if (e->rank != r) return ox_nfail(n, "the elements have ranks %d and %d", r, e->rank);
        if ((vs[i] = stack ? ox_insert_dim(n, e, (int)axis) : ox_graph(n, e)) < 0) return false;
    }
    kiln_value y = s->nseq == 1 ? vs[0] : kiln_concat(g, s->nseq, vs, (int)axis);
    return ox_set_graph(n, 0, y, s->type);
}

const OxHandler ox_seq_ops[] = {
    {"SequenceEmpty", op_sequence_empty},
    {"SequenceConstruct", op_sequence_construct},
    {"SequenceInsert", op_sequence_insert},
    {"SequenceErase", op_sequence_erase},
    {"SequenceAt", op_sequence_at},
    {"SequenceLength", op_sequence_length},
    {"SplitToSequence", op_split_to_sequence},
    {"ConcatFromSequence", op_concat_from_sequence},
};
const size_t ox_seq_nops = sizeof ox_seq_ops / sizeof ox_seq_ops[0];
