/*
 * test_spread.c -- the reference's own spread (rt_reference_spread,
 * kiln_interpret_perturbed): what lets the fused-vs-interpreted checks
 * tell an ill-conditioned element from a wrong kernel.
 *
 * tests/conditioning/ holds programs that `make fuzz-diff` once reported:
 * each failed the plain tolerance at an element with no well-defined float
 * answer (layer_norm of values with a large common offset, a where() on a
 * comparison at an exact tie, layer_norm of near-constant rows under sqrt,
 * a comparison of two values that are the same mean of equal floats).
 * For each: the interpreter, with its intermediates nudged, moves by more
 * than the plain tolerance there (an interpreter-only fact, the same on
 * every machine), and the fused result is within the tolerance plus the
 * spread everywhere. For well-conditioned programs the spread stays a
 * small fraction of the tolerance, so a 0.1% error is still caught at
 * every element: the allowance cannot hide a wrong kernel there. The
 * interp_ tests need no compiler (make valgrind runs them): seed 0 is the
 * plain interpreter, a seed moves a value by at most its nudges, and on an
 * analytic case (2x against layer_norm of values with a large offset) the
 * spread is an ulp where the answer is well defined and of order 1 where
 * it is not.
 */
#include "test.h"
#include "runtime/runtime.h"
#include "testutil.h"
#include <math.h>

#define MAX_IO 16

typedef struct {
    kiln_graph *g;
    RtProgram *p;
    int nin, nout;
    kiln_tensor in[MAX_IO], want[MAX_IO], spread[MAX_IO];
    float *got[MAX_IO];
    RtTolerance tol;
} Run;

/* Compile text, run it fused and interpreted on the inputs `kiln run --seed
 * seed` makes (as fuzz_diff does), and measure the reference's spread. */
static int run_case(Run *r, const char *text, const char *name, uint64_t seed) {
    char err[1024];
    *r = (Run){.g = kiln_graph_new()};
    if (kiln_parse(r->g, text, name) != KILN_OK) {
        printf("  %s: %s\n", name, kiln_error(r->g));
        return 0;
    }
    r->nin = kiln_num_inputs(r->g), r->nout = kiln_num_outputs(r->g);
    if (r->nin > MAX_IO || r->nout > MAX_IO) return 0;
    const float *fin[MAX_IO];
    for (int i = 0; i < r->nin; i++) {
        r->in[i] = kiln_input_desc(r->g, i);
        if (r->in[i].dtype != KILN_F32 || kiln_tensor_alloc(&r->in[i]) != KILN_OK) return 0;
        kiln_fill_randn(r->in[i].data, kiln_tensor_numel(&r->in[i]),
                        seed * 0x9E3779B97F4A7C15ull + (uint64_t)i);
        fin[i] = r->in[i].data;
    }
    for (int i = 0; i < r->nout; i++) {
        kiln_tensor d = kiln_output_desc(r->g, i);
        r->got[i] = malloc(sizeof(float) * (size_t)kiln_tensor_numel(&d));
    }
    if (rt_compile(r->g, NULL, &r->p, err, sizeof err) != KILN_OK ||
        rt_run(r->p, fin, r->got, err, sizeof err) != KILN_OK) {
        printf("  %s: %s\n", name, err);
        return 0;
    }
    r->tol = rt_tolerance(rt_graph(r->p));
    if (kiln_interpret(r->g, r->in, r->want) != KILN_OK ||
        rt_reference_spread(r->g, r->in, r->want, RT_SPREAD_RUNS, r->spread) != KILN_OK) {
        printf("  %s: %s\n", name, kiln_error(r->g));
        return 0;
    }
    return 1;
}

static void run_free(Run *r) {
    for (int i = 0; i < r->nin; i++) kiln_tensor_free(&r->in[i]);
    for (int i = 0; r->p && i < r->nout; i++) {
        kiln_tensor_free(&r->want[i]);
        kiln_tensor_free(&r->spread[i]);
    }
    for (int i = 0; i < r->nout; i++) free(r->got[i]);
    rt_free(r->p);
    kiln_graph_free(r->g);
}

static double allowance(const Run *r, float want) { return r->tol.atol + r->tol.rtol * fabs(want); }

/* Largest spread / plain allowance over every element (f32 outputs). */
static double worst_spread(const Run *r) {
    double worst = 0;
    for (int i = 0; i < r->nout; i++) {
        if (r->want[i].dtype != KILN_F32) continue;
        const float *w = r->want[i].data, *s = r->spread[i].data;
        for (int64_t k = 0; k < kiln_tensor_numel(&r->want[i]); k++)
            if (s[k] / allowance(r, w[k]) > worst) worst = s[k] / allowance(r, w[k]);
    }
    return worst;
}

TEST(spread_ill_conditioned_fuzz_cases) {
    static const char *names[] = {"offset_layer_norm", "where_tie", "sqrt_layer_norm", "mean_tie"};
    for (int c = 0; c < 4; c++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/conditioning/%s.kiln", test_srcdir(), names[c]);
        char *text = test_read_text(path);
        unsigned long long seed = 0;
        const char *at = text ? strstr(text, "seed ") : NULL;
        EXPECT(at && sscanf(at, "seed %llu", &seed) == 1, "%s: no seed in its header", path);
        if (!at || !seed) {
            free(text);
            continue;
        }
        Run r;
        if (!run_case(&r, text, names[c], seed)) {
            EXPECT(0, "%s did not run", names[c]);
            run_free(&r);
            free(text);
            continue;
        }
        /* the reference itself is undetermined beyond the plain tolerance */
        double ws = worst_spread(&r);
        EXPECT(ws > 1.0, "%s: the reference's spread is only %.3g of the tolerance", names[c], ws);
        /* and the fused result is within tolerance + spread everywhere */
        for (int i = 0; i < r.nout; i++) {
            const float *s = r.spread[i].data;
            for (int64_t k = 0; k < kiln_tensor_numel(&r.want[i]); k++) {
                float w = r.want[i].dtype == KILN_BOOL ? ((uint8_t *)r.want[i].data)[k]
                                                       : ((float *)r.want[i].data)[k];
                double x = rt_check_excess(r.want[i].dtype, r.got[i][k], w, s[k], r.tol);
                if (x > 1.0) {
                    EXPECT(0,
                           "%s: output %d[%lld]: fused %.9g, interpreter %.9g, spread %.3g "
                           "(%.3g x)",
                           names[c], i, (long long)k, r.got[i][k], w, s[k], x);
                    break;
                }
            }
        }
        run_free(&r);
        free(text);
    }
}

TEST(spread_small_where_well_conditioned) {
    /* pointwise math, a row sum, a row layer_norm and softmax: well
     * conditioned on standard normal inputs */
    const char *text = "input x: f32[37, 64]\n"
                       "input g: f32[64]\n"
                       "a = exp(tanh(x)) * 2 + sigmoid(x)\n"
                       "s = sum(x * x, dim=1)\n"
                       "n = layer_norm(x, [64], g)\n"
                       "m = softmax(x, dim=1)\n"
                       "output a, s, n, m\n";
    Run r;
    if (!run_case(&r, text, "well", 5)) {
        EXPECT(0, "the program did not run");
        run_free(&r);
        return;
    }
    double ws = worst_spread(&r);
    EXPECT(ws < 0.25, "spread %.3g of the tolerance on a well-conditioned program", ws);
    EXPECT(ws > 0.0, "the perturbed runs moved nothing: no nudges applied");
    /* a 0.1% error anywhere is still caught with the spread's allowance */
    int caught = 1;
    for (int i = 0; i < r.nout && caught; i++) {
        const float *w = r.want[i].data, *s = r.spread[i].data;
        for (int64_t k = 0; k < kiln_tensor_numel(&r.want[i]); k++) {
            float wrong = w[k] * 1.001f + (w[k] < 0 ? -1e-3f : 1e-3f);
            if (rt_excess_spread(wrong, w[k], s[k], r.tol) <= 1.0) {
                printf("  output %d[%lld]: %.9g against %.9g passes (spread %.3g)\n", i,
                       (long long)k, wrong, w[k], s[k]);
                caught = 0;
                break;
            }
        }
    }
    EXPECT(caught, "a 0.1%% error passed the check with the spread's allowance");
    run_free(&r);
}

TEST(interp_perturbed_seed0_is_plain) {
    /* seed 0 is the plain interpreter, bit for bit; a seed moves values
     * by at most the nudge (two ulps after each pointwise op) */
    kiln_graph *g = kiln_graph_new();
    EXPECT(kiln_parse(g, "input x: f32[1000]\ny = x * 3 + 1\noutput y\n", "t") == KILN_OK, "parse");
    kiln_tensor in = kiln_input_desc(g, 0), a, b, c;
    kiln_tensor_alloc(&in);
    kiln_fill_randn(in.data, 1000, 11);
    EXPECT(kiln_interpret(g, &in, &a) == KILN_OK, "interpret");
    EXPECT(kiln_interpret_perturbed(g, &in, &b, 0) == KILN_OK, "seed 0");
    EXPECT(kiln_interpret_perturbed(g, &in, &c, 3) == KILN_OK, "seed 3");
    EXPECT(!memcmp(a.data, b.data, 4000), "seed 0 differs from kiln_interpret");
    int moved = 0, within = 1;
    for (int k = 0; k < 1000; k++) {
        float x = ((float *)in.data)[k], p = ((float *)a.data)[k], q = ((float *)c.data)[k];
        moved += p != q;
        /* two nudges of 2^-22 (the product, then the sum) plus rounding */
        double bound = 0x1p-22 * (fabs(3.0 * x) + fabs(p)) + 0x1p-22 * fabs(p) + 1e-7;
        if (fabs((double)p - q) > bound) within = 0;
    }
    EXPECT(moved > 500, "only %d of 1000 elements moved", moved);
    EXPECT(within, "a nudge moved an element beyond two ulps per op");
    kiln_tensor_free(&in);
    kiln_tensor_free(&a);
    kiln_tensor_free(&b);
    kiln_tensor_free(&c);
    kiln_graph_free(g);
}

TEST(interp_reference_spread_analytic) {
    /* y = 2x is well conditioned: each run moves it by two nudges at most.
     * z = layer_norm(x 1e-4 + 1000) is not: the offset rounds every value
     * to ulp(1000) = 6.1e-5, about half the spread of a row, so the
     * normalized values move by order 1. (The interpreter alone: no JIT.) */
    kiln_graph *g = kiln_graph_new();
    EXPECT(kiln_parse(g,
                      "input x: f32[4, 8]\ny = x * 2\nz = layer_norm(x * 0.0001 + 1000, [8])\n"
                      "output y, z\n",
                      "t") == KILN_OK,
           "parse");
    kiln_tensor in = kiln_input_desc(g, 0), want[2], spread[2];
    kiln_tensor_alloc(&in);
    kiln_fill_randn(in.data, 32, 3);
    EXPECT(kiln_interpret(g, &in, want) == KILN_OK, "interpret");
    EXPECT(rt_reference_spread(g, &in, want, RT_SPREAD_RUNS, spread) == KILN_OK, "spread: %s",
           kiln_error(g));
    double ymax = 0, zmax = 0;
    int ybound = 1;
    for (int k = 0; k < 32; k++) {
        float y = ((float *)want[0].data)[k], sy = ((float *)spread[0].data)[k];
        float sz = ((float *)spread[1].data)[k];
        if (sy > 0x1p-21 * fabs(y) + 1e-30) ybound = 0;
        if (sy > ymax) ymax = sy;
        if (sz > zmax) zmax = sz;
    }
    EXPECT(ybound, "2x moved by more than two nudges (largest %.3g)", ymax);
    EXPECT(ymax > 0, "2x did not move at all: no nudges");
    EXPECT(zmax > 0.05, "the offset layer_norm moved by only %.3g", zmax);
    for (int i = 0; i < 2; i++) {
        kiln_tensor_free(&want[i]);
        kiln_tensor_free(&spread[i]);
    }
    kiln_tensor_free(&in);
    kiln_graph_free(g);
}
