/*
 * test_empty.c -- tensors with a dim of 0 (decompose.c, "empty values").
 *
 * An empty value computes nothing, so no kernel runs for one; a result that
 * is not empty but reads an empty operand follows from its kind: the
 * identity of a reduction, the other parts of a concat, the padding of a
 * pad, zeros (plus the bias) of a matmul or convolution over an empty
 * contraction. Each is checked against its analytic value, compiled and in
 * the interpreter, and the kernel count says no kernel was spent on an
 * empty value.
 */
#include <math.h>
#include <string.h>

#include "runtime/runtime.h"
#include "test.h"
#include "testutil.h"

/* What an output should be: its shape and, when filled, every element one
 * value (fill), else equal to the reference array ref. */
typedef struct {
    const char *name;
    int rank;
    int64_t shape[4];
    bool filled;
    float fill;
    const float *ref;
} Want;

static bool same(float a, float b) {
    return isnan(b) ? isnan(a) : a == b || fabsf(a - b) <= 1e-6f * fabsf(b);
}

static void check_output(const char *who, const kiln_tensor *t, const Want *w) {
    bool shape_ok = t->rank == w->rank;
    for (int d = 0; shape_ok && d < t->rank; d++) shape_ok = t->shape[d] == w->shape[d];
    EXPECT(shape_ok, "%s: output %s has the wrong shape (rank %d)", who, w->name, t->rank);
    if (!shape_ok) return;
    int64_t n = kiln_tensor_numel(t);
    const float *v = t->data;
    for (int64_t k = 0; k < n; k++) {
        float want = w->filled ? w->fill : w->ref[k];
        if (!same(v[k], want)) {
            EXPECT(false, "%s: output %s element %lld is %g, expected %g", who, w->name,
                   (long long)k, v[k], want);
            return;
        }
    }
}

/* Parse and compile src into *g and *p; false (recorded, nothing left)
 * when either fails. */
static bool compile_src(const char *src, kiln_graph **g, kiln_program **p) {
    *g = kiln_graph_new();
    *p = NULL;
    if (kiln_parse(*g, src, "empty") == KILN_OK && kiln_compile(*g, 0, p) == KILN_OK) return true;
    EXPECT(false, "compile: %s", kiln_error(*g));
    kiln_graph_free(*g);
    return false;
}

/* Parse src, bind its inputs (an empty one with no data at all), run it
 * compiled and interpreted, and compare every output with want. *ncalls
 * receives the compiled program's kernel and library calls. */
static void run_and_check(const char *src, int nin, const float *const *data, const Want *want,
                          int nout, int *ncalls) {
    kiln_graph *g;
    kiln_program *p;
    if (!compile_src(src, &g, &p)) return;
    kiln_tensor in[4], got[16], ref[16];
    for (int i = 0; i < nin; i++) {
        in[i] = kiln_input_desc(g, i);
        in[i].data = (void *)data[i]; /* NULL for an empty input */
    }
    if (kiln_num_outputs(g) != nout) {
        EXPECT(false, "%d outputs, expected %d", kiln_num_outputs(g), nout);
        nout = 0;
    }
    *ncalls = rt_stats(kiln_program_rt(p))->ncalls;
    if (kiln_program_run(p, in, got) == KILN_OK) {
        for (int k = 0; k < nout; k++) check_output("compiled", &got[k], &want[k]);
        for (int k = 0; k < nout; k++) kiln_tensor_free(&got[k]);
    } else {
        EXPECT(false, "run: %s", kiln_program_error(p));
    }
    if (kiln_interpret(g, in, ref) == KILN_OK) {
        for (int k = 0; k < nout; k++) check_output("interpreted", &ref[k], &want[k]);
        for (int k = 0; k < nout; k++) kiln_tensor_free(&ref[k]);
    } else {
        EXPECT(false, "interpret: %s", kiln_error(g));
    }
    kiln_program_free(p);
    kiln_graph_free(g);
}

/* Reductions over nothing, a concat with an empty part, pointwise work and
 * a slice that select nothing, a matmul over an empty contraction, a pad of
 * nothing. */
TEST(empty_tensors_flow) {
    test_use_shared_cache();
    static const char *src = "input x: f32[0, 4]\n"
                             "input y: f32[3, 4]\n"
                             "s = sum(x, 0)\n"
                             "q = prod(x, 0)\n"
                             "hi = amax(x, 0)\n"
                             "lo = amin(x, 0)\n"
                             "m = mean(x, 0)\n"
                             "c = cat([x, y, x], 0)\n"
                             "z = relu(x * 2 + 1)\n"
                             "e = slice(y, 0, 5, 7)\n"
                             "k = matmul(transpose(x, 0, 1), x)\n"
                             "p = pad(x, [0, 0, 1, 1], value=3)\n"
                             "r = sum(x, 1)\n"
                             "output s\noutput q\noutput hi\noutput lo\noutput m\noutput c\n"
                             "output z\noutput e\noutput k\noutput p\noutput r\n";
    float y[12];
    kiln_fill_randn(y, 12, 5);
    const float *data[2] = {NULL, y};
    const Want want[] = {
        {"s", 1, {4}, true, 0.0f, NULL},       {"q", 1, {4}, true, 1.0f, NULL},
        {"hi", 1, {4}, true, -INFINITY, NULL}, {"lo", 1, {4}, true, INFINITY, NULL},
        {"m", 1, {4}, true, NAN, NULL},        {"c", 2, {3, 4}, false, 0, y},
        {"z", 2, {0, 4}, true, 0, NULL},       {"e", 2, {0, 4}, true, 0, NULL},
        {"k", 2, {4, 4}, true, 0.0f, NULL},    {"p", 2, {2, 4}, true, 3.0f, NULL},
        {"r", 1, {0}, true, 0, NULL},
    };
    int ncalls = -1;
    run_and_check(src, 2, data, want, 11, &ncalls);
    /* Six filled outputs and the concat's copy at most; nothing for the
     * four empty ones. */
    EXPECT(ncalls >= 1 && ncalls <= 7, "%d kernels and calls", ncalls);
}

/* A convolution with no input channels is its bias; a transposed one too,
 * and a batch norm after one normalizes the bias (Conv-BN folding declines:
 * there is nothing to fold into). An output that is an empty input passes
 * through. */
TEST(empty_tensors_conv_bias) {
    test_use_shared_cache();
    static const char *src = "input x: f32[1, 0, 5, 5]\n"
                             "weight w: f32[3, 0, 3, 3] = randn(1)\n"
                             "weight b: f32[3] = randn(2)\n"
                             "weight wt: f32[0, 2, 3, 3] = randn(3)\n"
                             "weight bt: f32[2] = randn(4)\n"
                             "weight mu: f32[3] = zeros\n"
                             "weight var: f32[3] = ones\n"
                             "y = conv2d(x, w, b, padding=1)\n"
                             "t = conv_transpose2d(x, wt, bt)\n"
                             "u = batch_norm(conv2d(x, w, b), mu, var, eps=0.25)\n"
                             "output y\noutput t\noutput x\noutput u\n";
    float b[3], bt[2], yref[75], tref[98], uref[27];
    kiln_fill_randn(b, 3, 2);
    kiln_fill_randn(bt, 2, 4);
    for (int i = 0; i < 75; i++) yref[i] = b[i / 25];
    for (int i = 0; i < 98; i++) tref[i] = bt[i / 49];
    for (int i = 0; i < 27; i++) uref[i] = b[i / 9] / sqrtf(1.25f); /* (b - 0) / sqrt(1 + eps) */
    const float *data[1] = {NULL};
    const Want want[] = {
        {"y", 4, {1, 3, 5, 5}, false, 0, yref},
        {"t", 4, {1, 2, 7, 7}, false, 0, tref},
        {"x", 4, {1, 0, 5, 5}, true, 0, NULL},
        {"u", 4, {1, 3, 3, 3}, false, 0, uref},
    };
    int ncalls = -1;
    run_and_check(src, 1, data, want, 4, &ncalls);
    EXPECT(ncalls >= 1 && ncalls <= 3, "%d kernels and calls", ncalls);
}

/* What has no window or index to read is refused at the op that asks, with
 * its source position. */
TEST(empty_tensors_refused) {
    static const struct {
        const char *src, *msg;
    } cases[] = {
        {"input x: f32[1, 1, 0, 4]\ny = max_pool2d(x, 1, padding=1)\noutput y\n",
         "2:5: error: max_pool: dim 2 of the input is empty (size 0): its padded windows hold "
         "only padding"},
        {"input x: f32[0, 4]\ninput i: f32[3]\ny = gather(x, i)\noutput y\n",
         "3:5: error: gather: dim 0 of the data is empty: no index is in range"},
        {"input x: f32[0, 4]\ny = reshape(x, -1, 0)\noutput y\n",
         "2:5: error: reshape: dim 0 is -1 beside a dim of 0: its size is unknown"},
        {"input x: f32[0, 4]\ny = pad(x, [0, 0, 1, 1], mode=\"reflect\")\noutput y\n",
         "2:5: error: pad: dim 0 is empty (size 0): there is nothing to reflect"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kiln_graph *g = kiln_graph_new();
        kiln_status st = kiln_parse(g, cases[i].src, "prog");
        EXPECT(st == KILN_ERR_INPUT, "case %zu: status %d", i, (int)st);
        EXPECT(strstr(kiln_error(g), cases[i].msg), "case %zu: %s", i, kiln_error(g));
        kiln_graph_free(g);
    }
}

/* kiln_program_run_into takes an empty output with no memory at all, as
 * it takes an empty input: nothing is written through it. A bool one too. */
TEST(empty_tensors_run_into) {
    test_use_shared_cache();
    static const char *src = "input x: f32[0, 3]\n"
                             "input y: f32[2, 3]\n"
                             "z = x * 2\n"
                             "b = x > 0\n"
                             "s = sum(x, 0) + y\n"
                             "output z\noutput b\noutput s\n";
    kiln_graph *g;
    kiln_program *p;
    if (!compile_src(src, &g, &p)) return;
    float y[6] = {1, 2, 3, 4, 5, 6}, s[6] = {0};
    kiln_tensor in[2] = {kiln_input_desc(g, 0), kiln_input_desc(g, 1)};
    in[1].data = y;
    kiln_tensor out[3] = {kiln_output_desc(g, 0), kiln_output_desc(g, 1), kiln_output_desc(g, 2)};
    out[2].data = s;
    kiln_status st = kiln_program_run_into(p, in, out);
    EXPECT(st == KILN_OK, "run_into: %s", kiln_program_error(p));
    EXPECT(out[1].dtype == KILN_BOOL && out[1].shape[0] == 0, "b: dtype %d", (int)out[1].dtype);
    for (int k = 0; st == KILN_OK && k < 6; k++) EXPECT(s[k] == y[k], "s[%d] = %g", k, s[k]);
    kiln_program_free(p);
    kiln_graph_free(g);
}
