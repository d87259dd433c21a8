/*
 * onnx_rnn.c -- RNN, GRU and LSTM (opsets 7 to 14): every direction,
 * sequence_lens, initial states, peepholes, clip, input_forget,
 * linear_before_reset, the activation list, layout 1 (batch first).
 *
 * kiln's shapes are static, so the time loop is unrolled: the input
 * projection X W^T + biases is one matmul over every step at once, and
 * each step is a matmul H R^T and the gates' pointwise work, which kiln
 * fuses (into the matmul's epilogue and a kernel or two per step). At most
 * RNN_MAX_STEPS steps (an error names the limit beyond).
 *
 * sequence_lens: at steps t >= len[b] the state of batch b is carried and
 * its output is 0, by a select on a (t < len) mask. The reverse direction
 * reads each batch's valid prefix backwards: X reordered by the table
 * t -> len - 1 - t (t < len, else t; a flip without sequence_lens), the
 * forward recurrence run on it, and the outputs put back by the same
 * table (it is its own inverse).
 *
 * Equations (ONNX's operator docs; gates in the weights' order): RNN
 * H = f(x W^T + H R^T + Wb + Rb); GRU z, r = f(...), h = g(x Wh^T +
 * (r H) Rh^T + Rbh + Wbh), or with linear_before_reset
 * g(x Wh^T + Wbh + r (H Rh^T + Rbh)), H = (1 - z) h + z H; LSTM i, o, f, c
 * gates, i = f(... + Pi C), f = f(... + Pf C) (1 - i with input_forget),
 * C = f C + i g(c), o = f(... + Po C_new), H = o h(C). clip clamps each
 * gate before its activation.
 */
#include "front/front.h"
#include <strings.h>
#include <string.h>

enum { RNN_PLAIN, RNN_GRU, RNN_LSTM };
enum { RNN_MAX_STEPS = 1024 };

typedef struct {
    char name[24];
    double alpha, beta;
} Act;

/* The activation list: per direction, 1 (RNN), 2 (GRU) or 3 (LSTM). */
static bool read_acts(OxNode *n, int per, int nd, Act *acts) {
    static const char *const def[3][3] = {
        {"Tanh"}, {"Sigmoid", "Tanh"}, {"Sigmoid", "Tanh", "Tanh"}};
    const Onnx__AttributeProto *a = ox_attr(n, "activations");
    double al[16], be[16];
    int nal = ox_attr_floats(n, "activation_alpha", al, 16),
        nbe = ox_attr_floats(n, "activation_beta", be, 16), ia = 0, ib = 0;
    if (nal < -1 || nbe < -1) return false;
    if (a && a->n_strings != (size_t)(per * nd))
        return ox_nfail(n, "activations has %d names, want %d", (int)a->n_strings, per * nd);
    for (int k = 0; k < per * nd; k++) {
        Act *f = &acts[k];
        const char *d = def[per - 1][k % per];
        size_t len = a ? a->strings[k].len : strlen(d);
        if (len >= sizeof f->name) return ox_nfail(n, "unsupported activation");
        memcpy(f->name, a ? (const char *)a->strings[k].data : d, len);
        f->name[len] = 0;
        bool uses_a = !strcasecmp(f->name, "Affine") || !strcasecmp(f->name, "LeakyRelu") ||
                      !strcasecmp(f->name, "ThresholdedRelu") ||
                      !strcasecmp(f->name, "ScaledTanh") || !strcasecmp(f->name, "HardSigmoid") ||
                      !strcasecmp(f->name, "Elu");
        bool uses_b = !strcasecmp(f->name, "Affine") || !strcasecmp(f->name, "ScaledTanh") ||
                      !strcasecmp(f->name, "HardSigmoid");
        f->alpha = !strcasecmp(f->name, "LeakyRelu")     ? 0.01
                   : !strcasecmp(f->name, "HardSigmoid") ? 0.2
                                                         : 1.0;
        f->beta = !strcasecmp(f->name, "HardSigmoid") ? 0.5
                  : !strcasecmp(f->name, "Affine")    ? 0
                                                      : 1;
        if (uses_a && ia < nal) f->alpha = al[ia++];
        if (uses_b && ib < nbe) f->beta = be[ib++];
    }
    return true;
}

static kiln_value act(OxNode *n, const Act *f, kiln_value x) {
    Graph *g = n->im->g;
    const char *s = f->name;
    if (!strcasecmp(s, "Sigmoid")) return kiln_unary(g, "sigmoid", x);
    if (!strcasecmp(s, "Tanh")) return kiln_unary(g, "tanh", x);
    if (!strcasecmp(s, "Relu")) return kiln_unary(g, "relu", x);
    if (!strcasecmp(s, "Affine"))
        return kiln_binary(g, "add", kiln_binary(g, "mul", x, ox_sc(g, f->alpha)),
                           ox_sc(g, f->beta));
    if (!strcasecmp(s, "LeakyRelu"))
        return kiln_where(g, kiln_binary(g, "lt", x, ox_sc(g, 0)),
                          kiln_binary(g, "mul", x, ox_sc(g, f->alpha)), x);
    if (!strcasecmp(s, "ThresholdedRelu"))
        return kiln_where(g, kiln_binary(g, "gt", x, ox_sc(g, f->alpha)), x, ox_sc(g, 0));
    if (!strcasecmp(s, "ScaledTanh"))
        return kiln_binary(g, "mul",
                           kiln_unary(g, "tanh", kiln_binary(g, "mul", x, ox_sc(g, f->beta))),
                           ox_sc(g, f->alpha));
    if (!strcasecmp(s, "HardSigmoid")) {
        kiln_value y =
            kiln_binary(g, "add", kiln_binary(g, "mul", x, ox_sc(g, f->alpha)), ox_sc(g, f->beta));
        return kiln_clamp(g, y, 1, 0, 1, 1);
    }
    if (!strcasecmp(s, "Elu")) {
        kiln_value e = kiln_binary(g, "sub", kiln_unary(g, "exp", x), ox_sc(g, 1));
        return kiln_where(g, kiln_binary(g, "lt", x, ox_sc(g, 0)),
                          kiln_binary(g, "mul", e, ox_sc(g, f->alpha)), x);
    }
    if (!strcasecmp(s, "Softsign"))
        return kiln_binary(g, "div", x,
                           kiln_binary(g, "add", kiln_unary(g, "abs", x), ox_sc(g, 1)));
    if (!strcasecmp(s, "Softplus"))
        return kiln_unary(g, "log", kiln_binary(g, "add", kiln_unary(g, "exp", x), ox_sc(g, 1)));
    return ox_nfail(n, "unsupported activation '%s'", s), KILN_NONE;
}

/* Rows [lo, hi) of a 2-D value. */
static kiln_value rows(Graph *g, kiln_value m, int64_t lo, int64_t hi) {
    return kiln_slice(g, m, 0, lo, hi, 1);
}
static kiln_value cols(Graph *g, kiln_value m, int64_t lo, int64_t hi) {
    return kiln_slice(g, m, 1, lo, hi, 1);
}

/* Direction d of a (num_dir, a, b) value as (a, b). */
static kiln_value dir_of(Graph *g, kiln_value v, int d) {
    const int64_t *s = kiln_value_shape(g, v);
    int64_t two[2] = {s[1], s[2]};
    return kiln_reshape(g, kiln_slice(g, v, 0, d, d + 1, 1), 2, two);
}

/* Initial state k (h 5, c 6) of direction d as (B, H): zeros when absent;
 * (num_dir, B, H), or (B, num_dir, H) with layout 1. */
static kiln_value initial(OxNode *n, int k, int d, int64_t B, int64_t H) {
    Graph *g = n->im->g;
    int64_t bh[2] = {B, H};
    if (!ox_in(n, k)) return kiln_expand(g, ox_sc(g, 0), 2, bh);
    bool batch_first = ox_attr_i(n, "layout", 0) != 0;
    return kiln_reshape(g, kiln_slice(g, ox_gin(n, k), batch_first ? 1 : 0, d, d + 1, 1), 2, bh);
}

/* Initial state k absent (zeros) or a constant of zeros: the products
 * with it at step 0 are zero, and are left out. */
static bool zero_initial(OxNode *n, int k) {
    OxVal *v = ox_in(n, k);
    if (!v) return true;
    if (!v->c) return false;
    for (int64_t i = 0, m = ox_numel(v); i < m; i++)
        if (v->c[i] != 0) return false;
    return true;
}

/* x + y, or x where y is KILN_NONE (a product left out). */
static kiln_value add_or(Graph *g, kiln_value x, kiln_value y) {
    return y < 0 ? x : kiln_binary(g, "add", x, y);
}

typedef struct {
    int kind, nd, reverse_only;
    int64_t S, B, I, H;
    double clip;
    bool has_clip, input_forget, lbr;
    kiln_value lens; /* (B) f32, or KILN_NONE */
} Rnn;

/* v (S, B, K) with each batch's first len steps reversed (see the header). */
static kiln_value reorder(OxNode *n, const Rnn *r, kiln_value v, int64_t K) {
    Graph *g = n->im->g;
    if (r->lens < 0) return kiln_slice(g, v, 0, r->S - 1, -r->S - 1, -1);
    int64_t S = r->S, B = r->B, ts[2] = {S, 1}, ls[2] = {1, B}, base_s[3] = {1, B, K},
            sb1[3] = {S, B, 1}, flat[1] = {S * B * K};
    double *iota = arena_alloc(&n->im->arena, sizeof(double) * (size_t)S);
    double *base = arena_alloc(&n->im->arena, sizeof(double) * (size_t)(B * K));
    if (!iota || !base) return ox_nomem(n), KILN_NONE;
    for (int64_t t = 0; t < S; t++) iota[t] = (double)t;
    for (int64_t b = 0; b < B * K; b++) base[b] = (double)b;
    kiln_value t = ox_const_tensor(n, 2, ts, iota), len = kiln_reshape(g, r->lens, 2, ls);
    kiln_value back = kiln_binary(g, "sub", kiln_binary(g, "sub", len, ox_sc(g, 1)), t);
    kiln_value table = kiln_where(g, kiln_binary(g, "lt", t, len), back, t); /* (S, B) */
    kiln_value at =
        kiln_binary(g, "mul", kiln_reshape(g, table, 3, sb1), ox_sc(g, (double)(B * K)));
    at = kiln_binary(g, "add", at, ox_const_tensor(n, 3, base_s, base));
    return kiln_gather(g, kiln_reshape(g, v, 1, flat), at, 0);
}

static kiln_value gate(OxNode *n, const Rnn *r, const Act *f, kiln_value x) {
    if (r->has_clip) x = kiln_clamp(n->im->g, x, 1, -r->clip, 1, r->clip);
    return act(n, f, x);
}

/* One direction: Y (S, B, H), and the last H and C in *h, *c. */
static kiln_value run_dir(OxNode *n, const Rnn *r, int d, const Act *acts, kiln_value *h,
                          kiln_value *c) {
    Graph *g = n->im->g;
    int64_t S = r->S, B = r->B, I = r->I, H = r->H,
            G = r->kind == RNN_LSTM  ? 4
                : r->kind == RNN_GRU ? 3
                                     : 1;
    bool reverse = r->reverse_only || d == 1;
    kiln_value x = ox_gin(n, 0);
    if (ox_attr_i(n, "layout", 0)) x = kiln_permute(g, x, 3, (int[]){1, 0, 2});
    if (reverse) x = reorder(n, r, x, I);
    kiln_value W = dir_of(g, ox_gin(n, 1), d), R = dir_of(g, ox_gin(n, 2), d);
    int64_t sb[2] = {S * B, I}, sbg[3] = {S, B, G * H};
    kiln_value xw = kiln_matmul(g, kiln_reshape(g, x, 2, sb), kiln_transpose(g, W, 0, 1));
    kiln_value wb = KILN_NONE, rb = KILN_NONE;
    if (ox_in(n, 3)) {
        kiln_value bias =
            kiln_reshape(g, kiln_slice(g, ox_gin(n, 3), 0, d, d + 1, 1), 1, (int64_t[]){2 * G * H});
        wb = kiln_slice(g, bias, 0, 0, G * H, 1);
        rb = kiln_slice(g, bias, 0, G * H, 2 * G * H, 1);
        xw = kiln_binary(g, "add", xw, wb);
        if (r->kind != RNN_GRU)
            xw = kiln_binary(g, "add", xw, rb);
        else { /* GRU: Rbh goes with the reset gate, the z and r parts here */
            int64_t zero[1] = {0}, hpad[1] = {H};
            kiln_value rzr =
                kiln_pad(g, kiln_slice(g, rb, 0, 0, 2 * H, 1), KILN_PAD_CONSTANT, 1, zero, hpad, 0);
            xw = kiln_binary(g, "add", xw, rzr);
        }
    }
    xw = kiln_reshape(g, xw, 3, sbg);
    kiln_value rbh =
        rb >= 0 && r->kind == RNN_GRU ? kiln_slice(g, rb, 0, 2 * H, 3 * H, 1) : KILN_NONE;
    kiln_value peep = KILN_NONE;
    if (r->kind == RNN_LSTM && ox_in(n, 7))
        peep = kiln_reshape(g, kiln_slice(g, ox_gin(n, 7), 0, d, d + 1, 1), 1, (int64_t[]){3 * H});
    kiln_value hv = initial(n, 5, d, B, H),
               cv = r->kind == RNN_LSTM ? initial(n, 6, d, B, H) : KILN_NONE;
    if (hv < 0 || (r->kind == RNN_LSTM && cv < 0)) return KILN_NONE;
    bool h0 = zero_initial(n, 5); /* step 0's hv @ R^T is zero: no matmul */
    kiln_value *ys = arena_alloc(&n->im->arena, sizeof(kiln_value) * (size_t)S);
    if (!ys) return ox_nomem(n), KILN_NONE;
    int64_t b1[2] = {B, 1}, one_bh[3] = {1, B, H};
    for (int64_t t = 0; t < S; t++) {
        kiln_value xt =
            kiln_reshape(g, kiln_slice(g, xw, 0, t, t + 1, 1), 2, (int64_t[]){B, G * H});
        kiln_value hn, cn = KILN_NONE;
        bool zero = h0 && t == 0;
        if (r->kind == RNN_PLAIN) {
            hn = gate(
                n, r, &acts[0],
                add_or(g, xt, zero ? KILN_NONE : kiln_matmul(g, hv, kiln_transpose(g, R, 0, 1))));
        } else if (r->kind == RNN_GRU) {
            kiln_value hr = zero
                                ? KILN_NONE
                                : kiln_matmul(g, hv, kiln_transpose(g, rows(g, R, 0, 2 * H), 0, 1));
            kiln_value zr = add_or(g, cols(g, xt, 0, 2 * H), hr);
            kiln_value z = gate(n, r, &acts[0], cols(g, zr, 0, H));
            kiln_value rr = gate(n, r, &acts[0], cols(g, zr, H, 2 * H));
            kiln_value Rh = kiln_transpose(g, rows(g, R, 2 * H, 3 * H), 0, 1), pre;
            if (r->lbr) {
                kiln_value hh = zero ? KILN_NONE : kiln_matmul(g, hv, Rh);
                if (rbh >= 0) hh = hh < 0 ? rbh : kiln_binary(g, "add", hh, rbh);
                pre = add_or(g, cols(g, xt, 2 * H, 3 * H),
                             hh < 0 ? KILN_NONE : kiln_binary(g, "mul", rr, hh));
            } else {
                kiln_value hh =
                    zero ? KILN_NONE : kiln_matmul(g, kiln_binary(g, "mul", rr, hv), Rh);
                if (rbh >= 0) hh = hh < 0 ? rbh : kiln_binary(g, "add", hh, rbh);
                pre = add_or(g, cols(g, xt, 2 * H, 3 * H), hh);
            }
            kiln_value hc = gate(n, r, &acts[1], pre);
            hn = kiln_binary(g, "add",
                             kiln_binary(g, "mul", kiln_binary(g, "sub", ox_sc(g, 1), z), hc),
                             kiln_binary(g, "mul", z, hv));
        } else {
            kiln_value all =
                add_or(g, xt, zero ? KILN_NONE : kiln_matmul(g, hv, kiln_transpose(g, R, 0, 1)));
            kiln_value pi = cols(g, all, 0, H), po = cols(g, all, H, 2 * H),
                       pf = cols(g, all, 2 * H, 3 * H), pc = cols(g, all, 3 * H, 4 * H);
            if (peep >= 0) {
                pi = kiln_binary(g, "add", pi,
                                 kiln_binary(g, "mul", kiln_slice(g, peep, 0, 0, H, 1), cv));
                pf =
                    kiln_binary(g, "add", pf,
                                kiln_binary(g, "mul", kiln_slice(g, peep, 0, 2 * H, 3 * H, 1), cv));
            }
            kiln_value i = gate(n, r, &acts[0], pi);
            kiln_value f =
                r->input_forget ? kiln_binary(g, "sub", ox_sc(g, 1), i) : gate(n, r, &acts[0], pf);
            kiln_value cc = gate(n, r, &acts[1], pc);
            cn = kiln_binary(g, "add", kiln_binary(g, "mul", f, cv), kiln_binary(g, "mul", i, cc));
            if (peep >= 0)
                po = kiln_binary(g, "add", po,
                                 kiln_binary(g, "mul", kiln_slice(g, peep, 0, H, 2 * H, 1), cn));
            kiln_value o = gate(n, r, &acts[0], po);
            hn = kiln_binary(g, "mul", o, act(n, &acts[2], cn));
        }
        kiln_value yt = hn;
        if (r->lens >= 0) {
            kiln_value live =
                kiln_binary(g, "lt", ox_sc(g, (double)t), kiln_reshape(g, r->lens, 2, b1));
            hn = kiln_where(g, live, hn, hv);
            if (cn >= 0) cn = kiln_where(g, live, cn, cv);
            yt = kiln_where(g, live, yt, ox_sc(g, 0));
        }
        hv = hn;
        if (cn >= 0) cv = cn;
        ys[t] = kiln_reshape(g, yt, 3, one_bh);
        if (g->status != KILN_OK) return KILN_NONE;
    }
    kiln_value y = S == 1 ? ys[0] : kiln_concat(g, (int)S, ys, 0);
    if (reverse) y = reorder(n, r, y, H);
    *h = hv;
    *c = cv;
    return y;
}

static bool rnn(OxNode *n, int kind) {
    for (int k = 0; k < 3; k++)
        if (!ox_need_in(n, k)) return false;
    Graph *g = n->im->g;
    OxVal *xv = ox_in(n, 0), *wv = ox_in(n, 1), *rv = ox_in(n, 2);
    int G = kind == RNN_LSTM ? 4 : kind == RNN_GRU ? 3 : 1, per = kind + 1;
    bool batch_first = ox_attr_i(n, "layout", 0) != 0;
    if (xv->rank != 3 || wv->rank != 3 || rv->rank != 3)
        return ox_nfail(n, "X, W and R need rank 3");
    Rnn r = {.kind = kind, .lens = KILN_NONE};
    r.S = xv->shape[batch_first ? 1 : 0], r.B = xv->shape[batch_first ? 0 : 1], r.I = xv->shape[2];
    r.H = ox_attr_i(n, "hidden_size", wv->shape[1] / G);
    r.nd = ox_attr_is(n, "direction", "bidirectional", false) ? 2 : 1;
    r.reverse_only = ox_attr_is(n, "direction", "reverse", false);
    if (!ox_attr_is(n, "direction", "forward", true) && r.nd == 1 && !r.reverse_only)
        return ox_nfail(n, "direction must be forward, reverse or bidirectional");
    if (wv->shape[0] != r.nd || wv->shape[1] != G * r.H || wv->shape[2] != r.I ||
        rv->shape[0] != r.nd || rv->shape[1] != G * r.H || rv->shape[2] != r.H)
        return ox_nfail(n, "W or R does not match %d direction(s), hidden %lld, input %lld", r.nd,
                        (long long)r.H, (long long)r.I);
    if (r.S > RNN_MAX_STEPS)
        return ox_nfail(n, "unsupported: %lld time steps (kiln unrolls the time loop, up to %d)",
                        (long long)r.S, RNN_MAX_STEPS);
    r.has_clip = ox_attr(n, "clip") != NULL;
    r.clip = ox_attr_f(n, "clip", 0);
    r.input_forget = ox_attr_i(n, "input_forget", 0) != 0;
    r.lbr = ox_attr_i(n, "linear_before_reset", 0) != 0;
    if (ox_in(n, 4)) {
        OxVal *lv = ox_in(n, 4);
        if (lv->rank != 1 || lv->shape[0] != r.B)
            return ox_nfail(n, "sequence_lens needs shape (%lld)", (long long)r.B);
        const double *k = ox_known(lv);
        for (int64_t b = 0; k && b < r.B; b++)
            if (k[b] < 0 || k[b] > (double)r.S)
                return ox_nfail(n, "sequence length %g is outside [0, %lld]", k[b], (long long)r.S);
        r.lens = ox_gin(n, 4);
    }
    Act acts[6];
    if (!read_acts(n, per, r.nd, acts)) return false;
    kiln_value ys[2], hs[2], cs[2];
    int64_t s1[4] = {r.S, 1, r.B, r.H}, h1[3] = {1, r.B, r.H};
    for (int d = 0; d < r.nd; d++) {
        ys[d] = run_dir(n, &r, d, acts + per * d, &hs[d], &cs[d]);
        if (ys[d] < 0) return false;
        ys[d] = kiln_reshape(g, ys[d], 4, s1);
        hs[d] = kiln_reshape(g, hs[d], 3, h1);
        if (kind == RNN_LSTM) cs[d] = kiln_reshape(g, cs[d], 3, h1);
    }
    kiln_value y = r.nd == 2 ? kiln_concat(g, 2, ys, 1) : ys[0];
    kiln_value yh = r.nd == 2 ? kiln_concat(g, 2, hs, 0) : hs[0];
    kiln_value yc = kind != RNN_LSTM ? KILN_NONE : r.nd == 2 ? kiln_concat(g, 2, cs, 0) : cs[0];
    if (batch_first) {
        y = kiln_permute(g, y, 4, (int[]){2, 0, 1, 3});
        yh = kiln_permute(g, yh, 3, (int[]){1, 0, 2});
        if (kind == RNN_LSTM) yc = kiln_permute(g, yc, 3, (int[]){1, 0, 2});
    }
    return ox_set_graph(n, 0, y, OT_FLOAT) && ox_set_graph(n, 1, yh, OT_FLOAT) &&
           (kind != RNN_LSTM || ox_set_graph(n, 2, yc, OT_FLOAT));
}

static bool op_rnn(OxNode *n) { return rnn(n, RNN_PLAIN); }
static bool op_gru(OxNode *n) { return rnn(n, RNN_GRU); }
static bool op_lstm(OxNode *n) { return rnn(n, RNN_LSTM); }

/* ---- this file's handlers (onnx_ops.c looks ops up here) ---------------- */

const OxHandler ox_rnn_ops[] = {
    {"RNN", op_rnn},
    {"GRU", op_gru},
    {"LSTM", op_lstm},
};
const size_t ox_rnn_nops = sizeof ox_rnn_ops / sizeof ox_rnn_ops[0];
