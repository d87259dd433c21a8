/*
 * onnx_text.c -- TfIdfVectorizer over integer tokens (pool_int64s): the
 * n-gram counts of each row, weighted (TF, IDF, TFIDF), as ONNX's
 * reference counts them.
 *
 * For the pool's n-grams of one size n and one skip distance d (1 to
 * max_skip_count + 1; unigrams once, at d = 1), the count of n-gram j is
 * the number of starts s with x[s + k d] == token_k(j) for every k < n: a
 * sum over s of the product of n comparisons on the pair layout
 * (..., s, j), one fused reduction per (n, d), no L-by-J tensor in memory.
 * The counts of every size go to their output columns by one gather
 * (ngram_indexes), then the weighting. Tokens computed at run time work;
 * string pools are refused, as kiln has no strings.
 */
#include "front/front.h"
#include <math.h>
#include <string.h>

enum { TFIDF_MAX_N = 16 };

/* Zeros of x's shape with its last dim len (rows shorter than an n-gram
 * count none; the zero column for output columns no n-gram maps to). */
static kiln_value zeros(OxNode *n, const OxVal *x, int64_t len) {
    int64_t s[KILN_MAX_RANK];
    for (int i = 0; i < x->rank - 1; i++) s[i] = x->shape[i];
    s[x->rank - 1] = len;
    int64_t m = util_numel(x->rank, s);
    double *z = arena_alloc(&n->im->arena, sizeof(double) * (size_t)m);
    if (!z) return ox_nomem(n), KILN_NONE;
    memset(z, 0, sizeof(double) * (size_t)m);
    return ox_const_tensor(n, x->rank, s, z);
}

static bool op_tfidf(OxNode *n) {
    if (!ox_need_in(n, 0)) return false;
    Graph *g = n->im->g;
    OxVal *x = ox_in(n, 0);
    if (ox_attr(n, "pool_strings") && !ox_attr(n, "pool_int64s"))
        return ox_nfail(n, "unsupported: a pool of strings (kiln has no string tensors)");
    if (x->rank < 1 || x->rank > 2) return ox_nfail(n, "X must be [C] or [N, C]");
    const Onnx__AttributeProto *pa = ox_attr(n, "pool_int64s"), *ca = ox_attr(n, "ngram_counts"),
                               *ia = ox_attr(n, "ngram_indexes"), *wa = ox_attr(n, "weights");
    if (!pa || !ca || !ia)
        return ox_nfail(n, "pool_int64s, ngram_counts and ngram_indexes are required");
    int64_t minn = ox_attr_i(n, "min_gram_length", 1), maxn = ox_attr_i(n, "max_gram_length", 1),
            skips = ox_attr_i(n, "max_skip_count", 0);
    int mode = ox_attr_is(n, "mode", "TF", false)      ? 1
               : ox_attr_is(n, "mode", "IDF", false)   ? 2
               : ox_attr_is(n, "mode", "TFIDF", false) ? 3
                                                       : 0;
    if (!mode) return ox_nfail(n, "mode must be TF, IDF or TFIDF");
    if (minn < 1 || maxn < minn || maxn > TFIDF_MAX_N || skips < 0 || skips > 64)
        return ox_nfail(n, "gram lengths %lld to %lld or max_skip_count %lld out of range",
                        (long long)minn, (long long)maxn, (long long)skips);
    int64_t total = (int64_t)pa->n_ints, cols = 0;
    for (size_t i = 0; i < ia->n_ints; i++) cols = ia->ints[i] + 1 > cols ? ia->ints[i] + 1 : cols;
    if (cols < 1) return ox_nfail(n, "ngram_indexes is empty");
    if (wa && (int64_t)wa->n_floats != cols && wa->n_floats)
        return ox_nfail(n, "weights has %d values for %lld columns", (int)wa->n_floats,
                        (long long)cols);
    int r = x->rank;
    int64_t C = x->shape[r - 1];
    kiln_value xv = ox_gin(n, 0);
    /* src[c]: the flat index, among the counted n-grams, of the one that
     * goes to column c (or the zero after them) */
    double *src = arena_alloc(&n->im->arena, sizeof(double) * (size_t)cols);
    if (!src) return ox_nomem(n);
    for (int64_t c = 0; c < cols; c++) src[c] = -1;
    kiln_value parts[TFIDF_MAX_N + 1];
    int nparts = 0;
    int64_t counted = 0, id = 0;
    for (size_t si = 0; si < ca->n_ints; si++) {
        int64_t nsize = (int64_t)si + 1, start = ca->ints[si];
        int64_t end = si + 1 < ca->n_ints ? ca->ints[si + 1] : total;
        if (start < 0 || end > total || end < start || (end - start) % nsize)
            return ox_nfail(n, "ngram_counts does not split the pool into n-grams");
        int64_t J = (end - start) / nsize;
        if (nsize < minn || nsize > maxn || !J) {
            id += J;
            continue;
        }
        if (id + J > (int64_t)ia->n_ints) return ox_nfail(n, "ngram_indexes is too short");
        for (int64_t j = 0; j < J; j++) {
            int64_t c = ia->ints[id + j];
            if (c < 0) return ox_nfail(n, "a negative ngram index");
            if (src[c] >= 0)
                return ox_nfail(n, "unsupported: two n-grams share output column %lld",
                                (long long)c);
            src[c] = (double)(counted + j);
        }
        /* the same n-gram twice in the pool: the reference's trie gives its
         * node the later id, so only the later column counts */
        for (int64_t j = 0; j < J; j++)
            for (int64_t j2 = j + 1; j2 < J; j2++)
                if (!memcmp(pa->ints + start + j * nsize, pa->ints + start + j2 * nsize,
                            sizeof(int64_t) * (size_t)nsize)) {
                    src[ia->ints[id + j]] = -1; /* the zero column */
                    break;
                }
        /* counts [..., J]: for each skip distance a masked count */
        kiln_value cnt = KILN_NONE;
        int64_t dmax = nsize == 1 ? 1 : skips + 1;
        for (int64_t d = 1; d <= dmax; d++) {
            int64_t L = C - (nsize - 1) * d;
            if (L < 1) break;
            kiln_value m = KILN_NONE;
            for (int64_t k = 0; k < nsize; k++) {
                double *tok = arena_alloc(&n->im->arena, sizeof(double) * (size_t)J);
                if (!tok) return ox_nomem(n);
                for (int64_t j = 0; j < J; j++) tok[j] = (double)pa->ints[start + j * nsize + k];
                int64_t ts[2] = {1, J}, xs[3];
                kiln_value T = ox_const_tensor(n, 2, ts, tok); /* (1, J) */
                kiln_value xk = kiln_slice(g, xv, r - 1, k * d, k * d + L, 1);
                for (int i = 0; i < r - 1; i++) xs[i] = x->shape[i];
                xs[r - 1] = L, xs[r] = 1;
                kiln_value e = kiln_binary(g, "eq", kiln_reshape(g, xk, r + 1, xs), T);
                m = m < 0 ? e : kiln_where(g, m, e, m); /* and */
            }
            int dims[1] = {r - 1};
            kiln_value c1 =
                kiln_reduce(g, "sum", kiln_where(g, m, ox_sc(g, 1), ox_sc(g, 0)), 1, dims, 0);
            cnt = cnt < 0 ? c1 : kiln_binary(g, "add", cnt, c1);
        }
        if (cnt < 0) cnt = zeros(n, x, J); /* rows shorter than the n-gram */
        parts[nparts++] = cnt;
        counted += J, id += J;
    }
    /* a zero after the counts for the columns no n-gram maps to */
    parts[nparts++] = zeros(n, x, 1);
    for (int64_t c = 0; c < cols; c++)
        if (src[c] < 0) src[c] = (double)counted;
    kiln_value all = nparts == 1 ? parts[0] : kiln_concat(g, nparts, parts, r - 1);
    kiln_value y = kiln_gather(g, all, ox_const_tensor(n, 1, &cols, src), r - 1);
    if (mode != 1) {
        kiln_value w = ox_sc(g, 1);
        if (wa && wa->n_floats) {
            double *wv = arena_alloc(&n->im->arena, sizeof(double) * (size_t)cols);
            if (!wv) return ox_nomem(n);
            for (int64_t c = 0; c < cols; c++) wv[c] = wa->floats[c];
            w = ox_const_tensor(n, 1, &cols, wv);
        }
        y = mode == 2 ? kiln_where(g, kiln_binary(g, "gt", y, ox_sc(g, 0)),
                                   kiln_binary(g, "add", kiln_binary(g, "mul", y, ox_sc(g, 0)), w),
                                   kiln_binary(g, "mul", y, ox_sc(g, 0)))
                      : kiln_binary(g, "mul", y, w);
    }
    return ox_set_graph(n, 0, y, OT_FLOAT);
}

const OxHandler ox_text_ops[] = {
    {"TfIdfVectorizer", op_tfidf},
};
const size_t ox_text_nops = sizeof ox_text_ops / sizeof ox_text_ops[0];
