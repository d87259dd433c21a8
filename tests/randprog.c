/*
 * randprog.c -- a random .kiln program generator for differential testing.
 *
 * randprog(seed) writes a program: 1-3 inputs of random rank (0-5) and odd
 * or size-1 dims, then a random DAG of pointwise ops (unary and binary with
 * numpy broadcasting), reductions (sum/amax/amin/mean over random dims, with
 * and without keepdim), views (transpose, permute, reshape, expand, slice
 * with a positive or negative step, pad in its three modes, cat), the row
 * composites (softmax, layer_norm) and max/avg pooling. Values stay in
 * a numerically tame range (no exp of a big value, no log of a negative one)
 * so that fused and unfused results can be compared with a tight tolerance.
 * The same seed always gives the same program. randprog_empty(seed) is the
 * same generator with a dim of 0 in about half the inputs (empty values:
 * every op on them, and the non-empty results some compute from them).
 * randprog_f64(seed) makes the first input f64 and each other one f64 or
 * f32 at random: the same ops in double, and f32 values promoted where
 * they meet f64 ones.
 */
#include "randprog.h"
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define MAXV 64

typedef struct {
    uint64_t s;
    char *buf;
    size_t len, cap;
    int nv;
    bool empty; /* randprog_empty */
    bool f64;   /* randprog_f64 */
    int rank[MAXV];
    int64_t shape[MAXV][6];
} Gen;

static uint64_t next(Gen *g) {
    g->s ^= g->s << 13;
    g->s ^= g->s >> 7;
    g->s ^= g->s << 17;
    return g->s;
}
static int pick(Gen *g, int n) { return (int)(next(g) % (uint64_t)n); }

static void emit(Gen *g, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(g->buf + g->len, g->cap - g->len, fmt, ap);
    va_end(ap);
    if (n > 0) g->len += (size_t)n < g->cap - g->len ? (size_t)n : g->cap - g->len - 1;
}

static int64_t numel(Gen *g, int v) {
    int64_t n = 1;
    for (int d = 0; d < g->rank[v]; d++) n *= g->shape[v][d];
    return n;
}

static void shape_str(Gen *g, int v, char *out, size_t len) {
    size_t o = (size_t)snprintf(out, len, "[");
    for (int d = 0; d < g->rank[v]; d++)
        o += (size_t)snprintf(out + o, len - o, "%s%lld", d ? ", " : "", (long long)g->shape[v][d]);
    snprintf(out + o, len - o, "]");
}

static int new_value(Gen *g, int rank, const int64_t *shape) {
    int v = g->nv++;
    g->rank[v] = rank;
    memcpy(g->shape[v], shape, sizeof(int64_t) * (size_t)rank);
    return v;
}

static void add_input(Gen *g) {
    static const int64_t dims[] = {1, 2, 3, 4, 5, 7, 8, 16, 17, 33};
    int64_t shape[6];
    int rank = pick(g, 6);
    int64_t n = 1;
    for (int d = 0; d < rank; d++) {
        shape[d] = dims[pick(g, 10)];
        while (n * shape[d] > 4096) shape[d] = 1 + pick(g, 3);
        n *= shape[d];
    }
    if (g->empty && rank > 0 && pick(g, 2)) shape[pick(g, rank)] = 0;
    int v = new_value(g, rank, shape);
    char s[128];
    shape_str(g, v, s, sizeof s);
    emit(g, "input v%d: %s%s\n", v, g->f64 && (v == 0 || pick(g, 2)) ? "f64" : "f32", s);
}

/* Unary ops that keep any finite input finite and tame. */
static const char *tame_unary(Gen *g, int v, char *out, size_t len) {
    switch (pick(g, 12)) {
    case 0: snprintf(out, len, "relu(v%d)", v); break;
    case 1: snprintf(out, len, "sigmoid(v%d)", v); break;
    case 2: snprintf(out, len, "tanh(v%d)", v); break;
    case 3: snprintf(out, len, "sin(v%d)", v); break;
    case 4: snprintf(out, len, "cos(v%d)", v); break;
    case 5: snprintf(out, len, "exp(tanh(v%d))", v); break;
    case 6: snprintf(out, len, "log(abs(v%d) + 1)", v); break;
    case 7: snprintf(out, len, "sqrt(abs(v%d))", v); break;
    case 8: snprintf(out, len, "-v%d * 0.5", v); break;
    case 9: snprintf(out, len, "gelu(v%d)", v); break;
    case 10: snprintf(out, len, "clamp(v%d, min=-1, max=0.5)", v); break;
    default: snprintf(out, len, "erf(v%d)", v); break;
    }
    return out;
}

/* Values whose shape broadcasts with v's. */
static int broadcast_partner(Gen *g, int v) {
    int cands[MAXV], n = 0;
    for (int u = 0; u < g->nv; u++) {
        int r = g->rank[u] > g->rank[v] ? g->rank[u] : g->rank[v];
        bool ok = true;
        int64_t out = 1;
        for (int d = 0; d < r && ok; d++) {
            int du = d - (r - g->rank[u]), dv = d - (r - g->rank[v]);
            int64_t a = du >= 0 ? g->shape[u][du] : 1, b = dv >= 0 ? g->shape[v][dv] : 1;
            ok = a == b || a == 1 || b == 1;
            out *= a == 1 ? b : a; /* 0 with 1 is 0 */
        }
        if (ok && out <= 8192) cands[n++] = u;
    }
    /* v itself qualifies unless it is larger than 8192 elements itself (a
     * pool over a concat can be): then v pairs with itself. (Not added to
     * the candidates: that would change every other seed's program.) */
    return n ? cands[pick(g, n)] : v;
}

static void binary(Gen *g, int v) {
    static const char *ops[] = {"+", "-", "*", "maximum", "minimum", "where"};
    int u = broadcast_partner(g, v), op = pick(g, 6);
    int r = g->rank[u] > g->rank[v] ? g->rank[u] : g->rank[v];
    int64_t shape[6];
    for (int d = 0; d < r; d++) {
        int du = d - (r - g->rank[u]), dv = d - (r - g->rank[v]);
        int64_t a = du >= 0 ? g->shape[u][du] : 1, b = dv >= 0 ? g->shape[v][dv] : 1;
        shape[d] = a == 1 ? b : a; /* numpy: 0 with 1 is 0 */
    }
    int w = new_value(g, r, shape);
    if (op < 3)
        emit(g, "v%d = v%d %s v%d\n", w, v, ops[op], u);
    else if (op < 5)
        emit(g, "v%d = %s(v%d, v%d)\n", w, ops[op], v, u);
    else
        emit(g, "v%d = where(v%d > v%d, v%d, v%d * 0.5)\n", w, v, u, v, u);
}

static void unary(Gen *g, int v) {
    char e[128];
    int w = new_value(g, g->rank[v], g->shape[v]);
    emit(g, "v%d = %s\n", w, tame_unary(g, v, e, sizeof e));
}

static void reduction(Gen *g, int v) {
    static const char *ops[] = {"sum", "amax", "amin", "mean"};
    int r = g->rank[v], keep = pick(g, 2), dims[6], nd = 0;
    for (int d = 0; d < r; d++)
        if (pick(g, 2)) dims[nd++] = d;
    int64_t shape[6];
    int orank = 0;
    for (int d = 0, k = 0; d < r; d++) {
        bool red = nd == 0 || (k < nd && dims[k] == d);
        if (nd && red) k++;
        if (!red)
            shape[orank++] = g->shape[v][d];
        else if (keep)
            shape[orank++] = 1;
    }
    int w = new_value(g, orank, shape);
    emit(g, "v%d = %s(v%d", w, ops[pick(g, 4)], v);
    if (nd) {
        emit(g, ", dim=[");
        for (int k = 0; k < nd; k++)
            emit(g, "%s%d", k ? ", " : "", pick(g, 2) ? dims[k] - r : dims[k]);
        emit(g, "]");
    }
    emit(g, ", keepdim=%s)\n", keep ? "true" : "false");
}

/* slice with a negative step, from a random start down to the first element */
static void reverse_slice(Gen *g, int v, int64_t *shape) {
    int d = pick(g, g->rank[v]);
    int64_t n = shape[d], start = n ? pick(g, (int)n) : 0, step = 1 + pick(g, 3);
    shape[d] = n ? (start + step) / step : 0;
    int w = new_value(g, g->rank[v], shape);
    emit(g, "v%d = slice(v%d, %d, %lld, %lld, step=%lld)\n", w, v, d, (long long)start,
         (long long)-(n + 1), (long long)-step);
}

/* pad of the last dim: constant (maybe cropping), replicate or reflect */
static void pad(Gen *g, int v, int64_t *shape) {
    static const char *modes[] = {"constant", "replicate", "reflect"};
    int r = g->rank[v], mode = pick(g, 3);
    int64_t n = shape[r - 1], b = pick(g, 3), a = pick(g, 3);
    if ((mode == 2 && n == 1) || n == 0) mode = 0; /* nothing to repeat or reflect */
    if (mode == 2) {
        b = b < n - 1 ? b : n - 1;
        a = a < n - 1 ? a : n - 1;
    }
    if (mode == 0 && n > 2 && pick(g, 3) == 0) b = -1;
    if (n && numel(g, v) / n * (n + b + a) > 8192) b = a = 0;
    shape[r - 1] = n + b + a;
    int w = new_value(g, r, shape);
    emit(g, "v%d = pad(v%d, [%lld, %lld], mode=\"%s\", value=%s)\n", w, v, (long long)b,
         (long long)a, modes[mode], pick(g, 2) ? "0.5" : "0");
}

/* cat of v with pointwise functions of itself along a random dim */
static void cat(Gen *g, int v, int64_t *shape) {
    int d = pick(g, g->rank[v]), k = 2 + pick(g, 2);
    if (numel(g, v) * k > 8192) k = 1;
    shape[d] *= k;
    int w = new_value(g, g->rank[v], shape);
    emit(g, "v%d = cat([v%d", w, v);
    if (k > 1) emit(g, ", relu(v%d)", v);
    if (k > 2) emit(g, ", v%d * 0.5", v);
    emit(g, "], dim=%d)\n", d - (pick(g, 2) ? g->rank[v] : 0));
}

static void view(Gen *g, int v) {
    int r = g->rank[v];
    int64_t shape[6];
    memcpy(shape, g->shape[v], sizeof shape);
    int kind = r == 0 ? 2 : pick(g, 8);
    if (kind == 5) {
        reverse_slice(g, v, shape);
        return;
    }
    if (kind == 6) {
        pad(g, v, shape);
        return;
    }
    if (kind == 7) {
        cat(g, v, shape);
        return;
    }
    if (kind == 0 && r >= 2) { /* transpose */
        int a = pick(g, r), b = pick(g, r);
        int64_t t = shape[a];
        shape[a] = shape[b];
        shape[b] = t;
        int w = new_value(g, r, shape);
        emit(g, "v%d = transpose(v%d, %d, %d)\n", w, v, a, b);
    } else if (kind == 1 && r >= 1) { /* slice with a step */
        int d = pick(g, r);
        int64_t n = shape[d], start = n ? pick(g, (int)n) : 0, step = 1 + pick(g, 3);
        shape[d] = (n - start + step - 1) / step;
        int w = new_value(g, r, shape);
        emit(g, "v%d = slice(v%d, %d, %lld, %lld, step=%lld)\n", w, v, d, (long long)start,
             (long long)n, (long long)step);
    } else if (kind == 2 || r < 2) { /* reshape to flat, or add a size-1 dim */
        int64_t n = numel(g, v);
        if (r < 5 && pick(g, 2)) {
            int at = pick(g, r + 1);
            for (int d = r; d > at; d--) shape[d] = shape[d - 1];
            shape[at] = 1;
            int w = new_value(g, r + 1, shape);
            char s[128];
            shape_str(g, w, s, sizeof s);
            emit(g, "v%d = reshape(v%d, %s)\n", w, v, s);
        } else {
            int w = new_value(g, 1, &n);
            emit(g, "v%d = reshape(v%d, [-1])\n", w, v);
        }
    } else if (kind == 3) { /* expand a size-1 dim */
        int d = pick(g, r);
        if (shape[d] == 1 && numel(g, v) * 3 <= 8192) shape[d] = 3;
        int w = new_value(g, r, shape);
        char s[128];
        shape_str(g, w, s, sizeof s);
        emit(g, "v%d = expand(v%d, %s)\n", w, v, s);
    } else { /* permute: reverse */
        int64_t t[6];
        for (int d = 0; d < r; d++) t[d] = shape[r - 1 - d];
        int w = new_value(g, r, t);
        emit(g, "v%d = permute(v%d, [", w, v);
        for (int d = 0; d < r; d++) emit(g, "%s%d", d ? ", " : "", r - 1 - d);
        emit(g, "])\n");
    }
}

/* max or avg pooling over the last r-2 dims (PyTorch's limits: padding at
 * most half the kernel, so every window holds an element of the input) */
static void pool(Gen *g, int v) {
    int r = g->rank[v], ns = r - 2, is_max = pick(g, 2), ceil = pick(g, 2);
    int64_t shape[6], k[3], st[3], pd[3];
    memcpy(shape, g->shape[v], sizeof shape);
    for (int i = 0; i < ns; i++) {
        int64_t n = shape[2 + i];
        k[i] = 1 + pick(g, n < 3 ? (int)n : 3);
        st[i] = 1 + pick(g, 2);
        pd[i] = pick(g, (int)(k[i] / 2 + 1));
        int64_t room = n + 2 * pd[i] - k[i];
        int64_t out = (ceil ? room + st[i] - 1 : room) / st[i] + 1;
        if (ceil && (out - 1) * st[i] >= n + pd[i]) out--;
        shape[2 + i] = out;
    }
    int w = new_value(g, r, shape);
    emit(g, "v%d = %s_pool%dd(v%d, [", w, is_max ? "max" : "avg", ns, v);
    for (int i = 0; i < ns; i++) emit(g, "%s%lld", i ? ", " : "", (long long)k[i]);
    emit(g, "], stride=[");
    for (int i = 0; i < ns; i++) emit(g, "%s%lld", i ? ", " : "", (long long)st[i]);
    emit(g, "], padding=[");
    for (int i = 0; i < ns; i++) emit(g, "%s%lld", i ? ", " : "", (long long)pd[i]);
    emit(g, "], ceil_mode=%s", ceil ? "true" : "false");
    if (!is_max) emit(g, ", count_include_pad=%s", pick(g, 2) ? "true" : "false");
    emit(g, ")\n");
}

static void composite(Gen *g, int v) {
    int r = g->rank[v];
    if (r == 0) {
        unary(g, v);
        return;
    }
    if (r >= 3 && pick(g, 3) == 0) {
        if (numel(g, v) == 0) /* an empty window holds only padding: refused */
            unary(g, v);
        else
            pool(g, v);
        return;
    }
    int w = new_value(g, r, g->shape[v]);
    if (pick(g, 2))
        emit(g, "v%d = softmax(v%d, dim=%d)\n", w, v, pick(g, r) - (pick(g, 2) ? r : 0));
    else
        emit(g, "v%d = layer_norm(v%d, [%lld])\n", w, v, (long long)g->shape[v][r - 1]);
}

static size_t generate(uint64_t seed, char *buf, size_t cap, bool empty, bool f64) {
    Gen g = {seed * 0x9E3779B97F4A7C15ull + 1, buf, 0, cap, 0, empty, f64, {0}, {{0}}};
    buf[0] = 0;
    emit(&g, "# random program, seed %llu\n", (unsigned long long)seed);
    int ninputs = 1 + pick(&g, 3);
    for (int i = 0; i < ninputs; i++) add_input(&g);
    int nstmts = 3 + pick(&g, 10);
    for (int i = 0; i < nstmts && g.nv < MAXV - 1; i++) {
        int v = g.nv - 1 - pick(&g, g.nv < 4 ? g.nv : 4);
        switch (pick(&g, 10)) {
        case 0:
        case 1:
        case 2: unary(&g, v); break;
        case 3:
        case 4:
        case 5: binary(&g, v); break;
        case 6:
        case 7: reduction(&g, v); break;
        case 8: view(&g, v); break;
        default: composite(&g, v); break;
        }
    }
    /* outputs: the last value, and maybe one or two earlier computed ones */
    emit(&g, "output v%d", g.nv - 1);
    for (int k = 0; k < 2; k++) {
        int v = ninputs + pick(&g, g.nv - ninputs);
        if (v != g.nv - 1 && pick(&g, 2)) {
            emit(&g, ", v%d", v);
            break;
        }
    }
    emit(&g, "\n");
    return g.len;
}

size_t randprog(uint64_t seed, char *buf, size_t cap) {
    return generate(seed, buf, cap, false, false);
}

size_t randprog_empty(uint64_t seed, char *buf, size_t cap) {
    return generate(seed, buf, cap, true, false);
}

size_t randprog_f64(uint64_t seed, char *buf, size_t cap) {
    return generate(seed, buf, cap, false, true);
}
