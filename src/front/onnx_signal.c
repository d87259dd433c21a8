/*
 * onnx_signal.c -- ONNX's signal ops (opset 17): HannWindow, HammingWindow,
 * BlackmanWindow, DFT, STFT and MelWeightMatrix (a constant).
 *
 * A window depends only on its size, so it is a constant (the size known
 * at import: a constant, or an int input given with -i). A DFT of length
 * N along an axis is two products with constant N-by-K matrices of
 * cosines and sines (K = N, or N/2 + 1 one-sided): matmuls, on the BLAS
 * (O(N K) per line, as the naive DFT; no FFT). STFT gathers its frames
 * (one gather at constant indices), multiplies by the window, and does the
 * same products. Complex values are a last dim of 2 (real, imaginary), as
 * ONNX lays them out.
 */
#include "front/front.h"
#include <math.h>
#include <string.h>

/* Hann, Hamming, Blackman: sums of cosines a0 - a1 cos(2 pi n / D) +
 * a2 cos(4 pi n / D), D = N (periodic) or N - 1 (symmetric). */
static bool op_window(OxNode *n) {
    int64_t N;
    if (ox_const_ints(n, 0, &N, 1, "size") != 1)
        return ox_in(n, 0) && ox_known(ox_in(n, 0)) ? ox_nfail(n, "size must have one value")
                                                    : false;
    if (N < 1 || N > (1 << 24)) return ox_nfail(n, "size %lld is not 1 to 2^24", (long long)N);
    const char *op = ox_opname(n);
    double a0 = 0.5, a1 = 0.5, a2 = 0;
    if (!strcmp(op, "HammingWindow")) a0 = 25.0 / 46, a1 = 21.0 / 46;
    if (!strcmp(op, "BlackmanWindow")) a0 = 0.42, a1 = 0.5, a2 = 0.08;
    double D = ox_attr_i(n, "periodic", 1) ? (double)N : (double)(N - 1);
    OxVal *o = ox_set_const(n, 0, (int)ox_attr_i(n, "output_datatype", OT_FLOAT), 1, &N);
    if (!o) return ox_nomem(n);
    for (int64_t i = 0; i < N; i++) {
        double t = D > 0 ? 2 * M_PI * (double)i / D : 0;
        o->c[i] = a0 - a1 * cos(t) + a2 * cos(2 * t);
    }
    return true;
}

/* The DFT's matrices, rows n < rows, columns k < K: cos(2 pi k n / N) and
 * sign * sin(2 pi k n / N), times scale (the angle reduced mod N in
 * integers, so large k n lose nothing). */
static bool dft_mats(OxNode *n, int64_t rows, int64_t K, int64_t N, double sign, double scale,
                     kiln_value *C, kiln_value *S) {
    double *c = arena_alloc(&n->im->arena, sizeof(double) * (size_t)(rows * K));
    double *s = arena_alloc(&n->im->arena, sizeof(double) * (size_t)(rows * K));
    if (!c || !s) return ox_nomem(n);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < K; k++) {
            double t = 2 * M_PI * (double)((r * k) % N) / (double)N;
            c[r * K + k] = cos(t) * scale;
            s[r * K + k] = sign * sin(t) * scale;
        }
    int64_t shape[2] = {rows, K};
    *C = ox_const_tensor(n, 2, shape, c);
    *S = ox_const_tensor(n, 2, shape, s);
    return *C >= 0 && *S >= 0;
}

/* The DFT of re (+ i im, im KILN_NONE for a real signal) along the last
 * dim, whose length is rows (truncated to N, or zero-padded to N by using
 * only rows rows of the matrices): (re', im') = (re C - im S, re S + im C)
 * with S's sign -1 forward, +1 inverse (and 1/N). Returns the two parts
 * stacked on a new last dim. */
static kiln_value dft_last(OxNode *n, kiln_value re, kiln_value im, int64_t rows, int64_t N,
                           int64_t K, bool inverse) {
    Graph *g = n->im->g;
    kiln_value C = KILN_NONE, S = KILN_NONE;
    if (!dft_mats(n, rows, K, N, inverse ? 1 : -1, inverse ? 1.0 / (double)N : 1, &C, &S))
        return KILN_NONE;
    kiln_value yr = kiln_matmul(g, re, C), yi = kiln_matmul(g, re, S);
    if (im >= 0) {
        yr = kiln_binary(g, "sub", yr, kiln_matmul(g, im, S));
        yi = kiln_binary(g, "add", yi, kiln_matmul(g, im, C));
    }
    if (yr < 0 || yi < 0) return KILN_NONE; /* the graph's error says why */
    int r = kiln_value_rank(g, yr);
    int64_t s[KILN_MAX_RANK];
    memcpy(s, kiln_value_shape(g, yr), sizeof(int64_t) * (size_t)r);
    s[r] = 1;
    kiln_value parts[2] = {kiln_reshape(g, yr, r + 1, s), kiln_reshape(g, yi, r + 1, s)};
    return kiln_concat(g, 2, parts, r);
}

/* Input k's last dim split into the real part and (when it is 2) the
 * imaginary one, each without that dim. */
static bool complex_parts(OxNode *n, OxVal *x, kiln_value *re, kiln_value *im) {
    Graph *g = n->im->g;
    int r = x->rank;
    if (x->type == OT_BOOL || ox_is_int_type(x->type))
        return ox_nfail(n, "the signal is %s: this op takes a float tensor", ox_type_name(x->type));
    int64_t last = x->shape[r - 1];
    if (r < 2 || (last != 1 && last != 2))
        return ox_nfail(n, "the input's last dim must be 1 (real) or 2 (complex), not %lld",
                        (long long)last);
    kiln_value v = ox_graph(n, x);
    *re = kiln_reshape(g, kiln_slice(g, v, r - 1, 0, 1, 1), r - 1, x->shape);
    *im =
        last == 2 ? kiln_reshape(g, kiln_slice(g, v, r - 1, 1, 2, 1), r - 1, x->shape) : KILN_NONE;
    return true;
}

/* DFT (17; axis an input from 20): along a signal axis (not the batch dim
 * 0, not the complex dim), of length dft_length (the input's by default). */
static bool op_dft(OxNode *n) {
    if (!ox_need_in(n, 0)) return false;
    Graph *g = n->im->g;
    OxVal *x = ox_in(n, 0);
    int r = x->rank;
    int64_t axis = n->im->opset >= 20 ? -2 : ox_attr_i(n, "axis", 1), N;
    if (n->im->opset >= 20 && ox_in(n, 2) && ox_const_ints(n, 2, &axis, 1, "axis") != 1)
        return ox_known(ox_in(n, 2)) ? ox_nfail(n, "axis must have one value") : false;
    if (axis < 0) axis += r;
    if (axis < 1 || axis > r - 2)
        return ox_nfail(n, "axis must be a signal dim (1 to %d, or from the end -2 down)", r - 2);
    kiln_value re, im;
    if (!complex_parts(n, x, &re, &im)) return false;
    int64_t len = x->shape[axis];
    N = len;
    if (ox_in(n, 1) && ox_const_ints(n, 1, &N, 1, "dft_length") != 1)
        return ox_known(ox_in(n, 1)) ? ox_nfail(n, "dft_length must have one value") : false;
    if (N < 1) return ox_nfail(n, "dft_length is %lld, not positive", (long long)N);
    bool inverse = ox_attr_i(n, "inverse", 0) != 0, onesided = ox_attr_i(n, "onesided", 0) != 0;
    if (onesided && (inverse || im >= 0))
        return ox_nfail(n, "onesided applies to a forward DFT of a real signal");
    int64_t K = onesided ? N / 2 + 1 : N, rows = len < N ? len : N;
    /* the axis last: permute the signal dims, the complex dim gone */
    int perm[KILN_MAX_RANK], q = 0;
    for (int i = 0; i < r - 1; i++)
        if (i != axis) perm[q++] = i;
    perm[q++] = (int)axis;
    re = kiln_permute(g, re, r - 1, perm);
    if (im >= 0) im = kiln_permute(g, im, r - 1, perm);
    if (rows < len) {
        re = kiln_slice(g, re, r - 2, 0, rows, 1);
        if (im >= 0) im = kiln_slice(g, im, r - 2, 0, rows, 1);
    }
    kiln_value y = dft_last(n, re, im, rows, N, K, inverse);
    if (y < 0) return false;
    /* back: the transformed dim to the axis, the complex dim last */
    int back[KILN_MAX_RANK];
    for (int i = 0, j = 0; i < r - 1; i++) back[i] = i == axis ? r - 2 : j++;
    back[r - 1] = r - 1;
    return ox_set_graph(n, 0, kiln_permute(g, y, r, back), OT_FLOAT);
}

/* STFT: signal (batch, length, 1 or 2), frame_step, window (length L) or
 * frame_length; frames f < (length - L) / step + 1 start at f * step, each
 * multiplied by the window and transformed (one-sided by default: L/2 + 1
 * bins for a real signal). Output (batch, frames, bins, 2). */
static bool op_stft(OxNode *n) {
    if (!ox_need_in(n, 0)) return false;
    Graph *g = n->im->g;
    OxVal *x = ox_in(n, 0), *wv = ox_in(n, 2);
    int64_t step, L = -1;
    if (ox_const_ints(n, 1, &step, 1, "frame_step") != 1)
        return ox_in(n, 1) && ox_known(ox_in(n, 1)) ? ox_nfail(n, "frame_step must have one value")
                                                    : false;
    if (ox_in(n, 3) && ox_const_ints(n, 3, &L, 1, "frame_length") != 1)
        return ox_known(ox_in(n, 3)) ? ox_nfail(n, "frame_length must have one value") : false;
    if (x->rank != 3) return ox_nfail(n, "the signal must be 3-D (batch, length, 1 or 2)");
    if (wv && (wv->rank != 1 || (L >= 0 && wv->shape[0] != L)))
        return ox_nfail(n, "the window must be 1-D, of frame_length's length");
    if (wv) L = wv->shape[0];
    if (L < 1) return ox_nfail(n, "a window or a frame_length is required");
    int64_t len = x->shape[1];
    if (!ox_index_fits(n, len, "a signal")) return false;
    if (step < 1 || L > len)
        return ox_nfail(n, "frame_step %lld and frame length %lld do not fit a signal of %lld",
                        (long long)step, (long long)L, (long long)len);
    kiln_value re, im;
    if (!complex_parts(n, x, &re, &im)) return false;
    bool onesided = ox_attr_i(n, "onesided", 1) != 0;
    if (onesided && im >= 0) return ox_nfail(n, "onesided applies to a real signal");
    int64_t F = (len - L) / step + 1, K = onesided ? L / 2 + 1 : L;
    double *ix = arena_alloc(&n->im->arena, sizeof(double) * (size_t)(F * L));
    if (!ix) return ox_nomem(n);
    for (int64_t f = 0; f < F; f++)
        for (int64_t t = 0; t < L; t++) ix[f * L + t] = (double)(f * step + t);
    int64_t is[2] = {F, L};
    kiln_value idx = ox_const_tensor(n, 2, is, ix);
    if (idx < 0) return false;
    re = kiln_gather(g, re, idx, 1); /* (B, F, L) */
    if (im >= 0) im = kiln_gather(g, im, idx, 1);
    if (wv) {
        kiln_value w = ox_graph(n, wv);
        re = kiln_binary(g, "mul", re, w);
        if (im >= 0) im = kiln_binary(g, "mul", im, w);
    }
    return ox_set_graph(n, 0, dft_last(n, re, im, L, L, K, false), OT_FLOAT);
}

/* MelWeightMatrix: the (dft_length / 2 + 1, num_mel_bins) triangular
 * filters between lower and upper edge (Hz) on the mel scale, after ONNX's
 * reference; a constant, all five inputs known at import (the edges are
 * floats: constants or inputs given with -i). */
static bool op_mel_weight_matrix(OxNode *n) {
    double v[5];
    static const char *const what[5] = {"num_mel_bins", "dft_length", "sample_rate",
                                        "lower_edge_hertz", "upper_edge_hertz"};
    for (int k = 0; k < 5; k++) {
        OxVal *x = ox_in(n, k);
        if (!x) return ox_nfail(n, "the %s input is required", what[k]);
        if (!ox_known(x) || ox_numel(x) != 1)
            return ox_nfail(n,
                            "unsupported: the %s input '%s' is computed at run time (give its "
                            "value, kiln run -i %s=FILE)",
                            what[k], x->name, x->name);
        v[k] = ox_known(x)[0];
    }
    int64_t mels = (int64_t)v[0], dft = (int64_t)v[1], sr = (int64_t)v[2];
    if (mels < 1 || dft < 1 || sr < 1 || mels > 4096 || dft > (1 << 20))
        return ox_nfail(n, "num_mel_bins, dft_length and sample_rate must be positive");
    int64_t bins = dft / 2 + 1, shape[2] = {bins, mels};
    int64_t *f = arena_alloc(&n->im->arena, sizeof(int64_t) * (size_t)(mels + 2));
    if (!f) return ox_nomem(n);
    double lo = 2595 * log10(1 + (double)(float)v[3] / 700),
           hi = 2595 * log10(1 + (double)(float)v[4] / 700), step = (hi - lo) / (double)(mels + 2);
    for (int64_t i = 0; i < mels + 2; i++) {
        double hz = 700 * (pow(10, ((double)i * step + lo) / 2595) - 1);
        f[i] = (int64_t)floor((double)(dft + 1) * hz / (double)sr);
        if (f[i] < 0 || f[i] >= bins + (i == mels + 1))
            return ox_nfail(n, "the edges put a filter outside the %lld frequency bins",
                            (long long)bins);
    }
    OxVal *o = ox_set_const(n, 0, (int)ox_attr_i(n, "output_datatype", OT_FLOAT), 2, shape);
    if (!o) return ox_nomem(n);
    memset(o->c, 0, sizeof(double) * (size_t)(bins * mels));
    for (int64_t i = 0; i < mels; i++) {
        int64_t l = f[i], c = f[i + 1], h = f[i + 2];
        if (c == l)
            o->c[c * mels + i] = 1;
        else
            for (int64_t j = l; j <= c; j++) o->c[j * mels + i] = (double)(j - l) / (double)(c - l);
        for (int64_t j = c; j < h; j++) o->c[j * mels + i] = (double)(h - j) / (double)(h - c);
    }
    return true;
}

const OxHandler ox_signal_ops[] = {
    {"MelWeightMatrix", op_mel_weight_matrix},
    {"HannWindow", op_window},
    {"HammingWindow", op_window},
    {"BlackmanWindow", op_window},
    {"DFT", op_dft},
    {"STFT", op_stft},
};
const size_t ox_signal_nops = sizeof ox_signal_ops / sizeof ox_signal_ops[0];
