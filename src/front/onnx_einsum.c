/*
 * onnx_einsum.c -- Einsum (12): any equation of letters and one ellipsis
 * per term, implicit or explicit output, repeated letters in an operand
 * (diagonals), broadcast dims of 1.
 *
 * Every operand is brought to one layout: the ellipsis dims first, then
 * the equation's letters in order of first appearance, each operand's
 * diagonals taken (a strided slice of two merged dims) and its missing
 * letters as dims of 1. The product of all operands, summed over the
 * letters the output lacks, then permuted to the output's order, is
 * pointwise work under a reduction: one fused loop, no intermediate
 * product in memory (a matmul-shaped equation does its multiply-adds in
 * that loop, not on the BLAS).
 */
#include "front/front.h"
#include <ctype.h>
#include <string.h>

enum { EIN_MAX_IN = 8, EIN_LETTERS = 52 };

typedef struct {
    char lab[KILN_MAX_RANK + 1]; /* one letter per dim, '.' for an ellipsis dim */
    int rank;
} Term;

static int letter_id(char c) { return isupper((unsigned char)c) ? c - 'A' + 26 : c - 'a'; }

/* Parse one term (letters and at most one "...") against an operand of
 * rank r (r < 0: the output, whose ellipsis has ne dims). */
static bool parse_term(OxNode *n, const char *s, size_t len, int r, int *ne, Term *t) {
    int letters = 0, dots = -1;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '.') {
            if (dots >= 0 || i + 2 >= len || s[i + 1] != '.' || s[i + 2] != '.')
                return ox_nfail(n, "a malformed ellipsis in the equation");
            dots = letters;
            i += 2;
        } else if (isalpha((unsigned char)s[i])) {
            letters++;
        } else if (s[i] != ' ') {
            return ox_nfail(n, "'%c' in the equation", s[i]);
        }
    }
    int ed = r >= 0 ? r - letters : (dots >= 0 ? *ne : 0);
    if (ed < 0 || (dots < 0 && ed > 0))
        return ox_nfail(n, "a term has %d letters for rank %d", letters, r);
    if (r >= 0 && dots >= 0 && ed > *ne) *ne = ed; /* shorter ones broadcast */
    t->rank = letters + ed;
    if (t->rank > KILN_MAX_RANK) return ox_nfail(n, "unsupported: rank above 8");
    int k = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '.') {
            for (int e = 0; e < ed; e++) t->lab[k++] = (char)('0' + e);
            i += 2;
        } else if (isalpha((unsigned char)s[i])) {
            t->lab[k++] = s[i];
        }
    }
    t->lab[k] = 0;
    return true;
}

static bool op_einsum(OxNode *n) {
    Graph *g = n->im->g;
    const Onnx__AttributeProto *ea = ox_attr(n, "equation");
    if (!ea || !ea->s.data) return ox_nfail(n, "the equation attribute is required");
    char eq[512];
    util_fmt(eq, sizeof eq, "%.*s", (int)ea->s.len, (const char *)ea->s.data);
    if (n->nin < 1 || n->nin > EIN_MAX_IN) return ox_nfail(n, "1 to %d operands", EIN_MAX_IN);
    for (int k = 0; k < n->nin; k++)
        if (!ox_need_in(n, k)) return false;
    const char *arrow = strstr(eq, "->");
    size_t lhs = arrow ? (size_t)(arrow - eq) : strlen(eq);
    Term in[EIN_MAX_IN], out;
    int ne = -1, nt = 0;
    for (size_t at = 0; at <= lhs; nt++) {
        size_t e = at;
        while (e < lhs && eq[e] != ',') e++;
        if (nt >= n->nin) return ox_nfail(n, "the equation has more terms than operands");
        /* ellipsis dims are numbered from the right: align them per operand */
        if (!parse_term(n, eq + at, e - at, ox_in(n, nt)->rank, &ne, &in[nt])) return false;
        at = e + 1;
    }
    if (nt != n->nin) return ox_nfail(n, "the equation has %d terms for %d operands", nt, n->nin);
    if (ne < 0) ne = 0;
    /* an operand's ellipsis may be shorter (broadcast): renumber its dims
     * so that they line up from the right with the longest */
    for (int k = 0; k < nt; k++) {
        int ed = 0;
        for (int d = 0; d < in[k].rank; d++) ed += in[k].lab[d] < 'A';
        for (int d = 0, j = 0; d < in[k].rank; d++)
            if (in[k].lab[d] < 'A') in[k].lab[d] = (char)('0' + ne - ed + j++);
    }
    int count[EIN_LETTERS] = {0};
    char order[EIN_LETTERS + 1];
    int no = 0;
    for (int k = 0; k < nt; k++)
        for (int d = 0; d < in[k].rank; d++)
            if (in[k].lab[d] >= 'A' && !count[letter_id(in[k].lab[d])]++)
                order[no++] = in[k].lab[d];
    order[no] = 0;
    if (arrow) {
        if (!parse_term(n, arrow + 2, strlen(arrow + 2), -1, &ne, &out)) return false;
        for (int d = 0; d < out.rank; d++)
            if (out.lab[d] >= 'A' && !count[letter_id(out.lab[d])])
                return ox_nfail(n, "the output's '%c' is in no operand", out.lab[d]);
    } else { /* implicit: the ellipsis, then letters seen once, sorted */
        int k = 0;
        for (int e = 0; e < ne; e++) out.lab[k++] = (char)('0' + e);
        for (int c = 0; c < EIN_LETTERS; c++)
            if (count[c] == 1) out.lab[k++] = (char)(c < 26 ? 'a' + c : 'A' + c - 26);
        out.lab[k] = 0;
        out.rank = k;
    }
    /* the common layout: ellipsis dims, then order[] */
    int R = ne + no;
    if (R > KILN_MAX_RANK)
        return ox_nfail(n, "unsupported: %d distinct dims (kiln's rank is at most 8)", R);
    char all[KILN_MAX_RANK + 1];
    for (int e = 0; e < ne; e++) all[e] = (char)('0' + e);
    memcpy(all + ne, order, (size_t)no + 1);
    int64_t size[KILN_MAX_RANK];
    for (int i = 0; i < R; i++) size[i] = 1;
    kiln_value prod = KILN_NONE;
    for (int k = 0; k < nt; k++) {
        OxVal *x = ox_in(n, k);
        kiln_value v = ox_graph(n, x);
        char lab[KILN_MAX_RANK + 1];
        int64_t sh[KILN_MAX_RANK];
        int r = in[k].rank;
        memcpy(lab, in[k].lab, (size_t)r + 1);
        memcpy(sh, x->shape, sizeof(int64_t) * (size_t)r);
        /* diagonals: a repeated letter's two dims brought together and read
         * with stride n + 1 */
        for (int a = 0; a < r; a++)
            for (int b = a + 1; b < r; b++) {
                if (lab[a] != lab[b] || lab[a] < 'A') continue;
                if (sh[a] != sh[b])
                    return ox_nfail(n, "'%c' has sizes %lld and %lld", lab[a], (long long)sh[a],
                                    (long long)sh[b]);
                int perm[KILN_MAX_RANK], q = 0;
                for (int d = 0; d < r; d++)
                    if (d != b) perm[q++] = d;
                /* move b right after a */
                int p2[KILN_MAX_RANK], m = 0;
                for (int d = 0; d < r - 1; d++) {
                    p2[m++] = perm[d];
                    if (perm[d] == a) p2[m++] = b;
                }
                v = kiln_permute(g, v, r, p2);
                char l2[KILN_MAX_RANK + 1];
                int64_t s2[KILN_MAX_RANK], s3[KILN_MAX_RANK];
                for (int d = 0; d < r; d++) l2[d] = lab[p2[d]], s2[d] = sh[p2[d]];
                int at = 0;
                while (p2[at] != a) at++;
                int j = 0;
                for (int d = 0; d < r; d++) {
                    if (d == at)
                        s3[j++] = s2[d] * s2[d];
                    else if (d != at + 1)
                        s3[j++] = s2[d];
                }
                v = kiln_reshape(g, v, r - 1, s3);
                v = kiln_slice(g, v, at, 0, s2[at] * s2[at], s2[at] + 1);
                for (int d = 0, w = 0; d < r; d++)
                    if (d != at + 1) lab[w] = l2[d], sh[w] = s2[d], w++;
                r--;
                lab[r] = 0;
                a = -1;
                break;
            }
        /* to the common layout: permute to the order of all[], dims of 1
         * for the letters it lacks */
        int perm[KILN_MAX_RANK], q = 0;
        int64_t full[KILN_MAX_RANK];
        for (int i = 0; i < R; i++) {
            full[i] = 1;
            for (int d = 0; d < r; d++)
                if (lab[d] == all[i]) {
                    perm[q++] = d;
                    full[i] = sh[d];
                }
        }
        for (int i = 0; i < R; i++) {
            if (full[i] == 1) continue;
            if (size[i] != 1 && size[i] != full[i])
                return ox_nfail(n, "'%c' has sizes %lld and %lld", all[i], (long long)size[i],
                                (long long)full[i]);
            size[i] = full[i];
        }
        if (q > 1) v = kiln_permute(g, v, q, perm);
        v = kiln_reshape(g, v, R, full);
        prod = prod < 0 ? v : kiln_binary(g, "mul", prod, v);
    }
    if (nt == 1) prod = kiln_binary(g, "add", prod, ox_sc(g, 0)); /* a fresh value */
    int dims[KILN_MAX_RANK], nd = 0;
    for (int i = 0; i < R; i++)
        if (!strchr(out.lab, all[i])) dims[nd++] = i;
    kiln_value y = nd ? kiln_reduce(g, "sum", prod, nd, dims, 0) : prod;
    /* the kept dims are all[] without the summed ones, in that order */
    char kept[KILN_MAX_RANK + 1];
    int nk = 0;
    for (int i = 0; i < R; i++)
        if (strchr(out.lab, all[i])) kept[nk++] = all[i];
    kept[nk] = 0;
    if (nk != out.rank) return ox_nfail(n, "the output repeats a letter");
    int perm[KILN_MAX_RANK];
    bool same = true;
    for (int d = 0; d < nk; d++) {
        perm[d] = (int)(strchr(kept, out.lab[d]) - kept);
        same &= perm[d] == d;
    }
    if (!same) y = kiln_permute(g, y, nk, perm);
    return ox_set_graph(n, 0, y, ox_in(n, 0)->type);
}

const OxHandler ox_einsum_ops[] = {
    {"Einsum", op_einsum},
};
const size_t ox_einsum_nops = sizeof ox_einsum_ops / sizeof ox_einsum_ops[0];
