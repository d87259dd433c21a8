/*
 * test_serve.c -- one compiled program shared by many threads (kiln.h,
 * "Threads"): what a server does with a model.
 *
 * The program has fused kernels (a row softmax), a matmul with a fused
 * epilogue (bias, relu), a conv2d with one (bias, relu) and a gather with
 * one (tanh), and its inputs come in NSETS sets. Every set is first run
 * alone and checked against the interpreter; then NTHREADS threads run the
 * one program NRUNS times each at once, every thread cycling through the
 * sets in its own order, and every output of every run must equal the
 * set's lone run bit for bit (a run's kernels and library calls do the same
 * arithmetic whoever else runs: one thread each). A run that shared
 * another's intermediates would differ. Also: two programs interleaved on
 * the same threads, a run-time error that reaches only its own thread, and
 * the pool of run states: no more than the runs in flight at once, and
 * none new for runs one after another.
 */
#include "test.h"
#include "testutil.h"
#include "runtime/runtime.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { NTHREADS = 4, NRUNS = 200, NSETS = 8, NIN = 3, NOUT = 3 };

static kiln_graph *serve_graph(void) {
    kiln_graph *g = kiln_graph_new();
    kiln_value x = kiln_input(g, "x", KILN_F32, 2, (int64_t[]){64, 48});
    kiln_value w = test_random_weight(g, "w", 2, (int64_t[]){48, 32}, 11);
    kiln_value b = test_random_weight(g, "b", 1, (int64_t[]){32}, 12);
    kiln_value h = kiln_unary(g, "relu", kiln_binary(g, "add", kiln_matmul(g, x, w), b));
    kiln_output(g, kiln_softmax(g, kiln_binary(g, "mul", h, kiln_scalar(g, 0.5)), 1), "probs");
    kiln_value img = kiln_input(g, "img", KILN_F32, 4, (int64_t[]){2, 3, 12, 12});
    kiln_value cw = test_random_weight(g, "cw", 4, (int64_t[]){8, 3, 3, 3}, 13);
    kiln_value cb = test_random_weight(g, "cb", 1, (int64_t[]){8}, 14);
    kiln_conv_params cp = kiln_conv_defaults();
    cp.padding[0] = cp.padding[1] = 1;
    kiln_output(g, kiln_unary(g, "relu", kiln_conv2d(g, img, cw, cb, &cp)), "feat");
    kiln_value table = test_random_weight(g, "table", 2, (int64_t[]){100, 16}, 15);
    kiln_value idx = kiln_input(g, "idx", KILN_F32, 1, (int64_t[]){20});
    kiln_output(g, kiln_unary(g, "tanh", kiln_gather(g, table, idx, 0)), "emb");
    return g;
}

/* A second, different program for the interleaved test. */
static kiln_graph *other_graph(void) {
    kiln_graph *g = kiln_graph_new();
    kiln_value x = kiln_input(g, "x", KILN_F32, 2, (int64_t[]){128, 256});
    kiln_value y = kiln_unary(g, "gelu", kiln_binary(g, "add", x, kiln_scalar(g, 0.25)));
    kiln_output(g, kiln_layer_norm(g, y, 1, (int64_t[]){256}, KILN_NONE, KILN_NONE, 1e-5), "ln");
    return g;
}

typedef struct {
    kiln_tensor in[NSETS][NIN];
    kiln_tensor want[NSETS][NOUT]; /* the set's lone fused run */
    int nin, nout;
} Sets;

/* Input set s of g: random normal data, indices integral in [0, 100). */
static bool make_sets(kiln_graph *g, Sets *S) {
    S->nin = kiln_num_inputs(g);
    S->nout = kiln_num_outputs(g);
    for (int s = 0; s < NSETS; s++)
        for (int i = 0; i < S->nin; i++) {
            kiln_tensor *t = &S->in[s][i];
            *t = kiln_input_desc(g, i);
            if (kiln_tensor_alloc(t) != KILN_OK) return false;
            float *d = t->data;
            int64_t n = kiln_tensor_numel(t);
            kiln_fill_randn(d, n, 1000u * (uint64_t)s + (uint64_t)i);
            if (!strcmp(kiln_input_name(g, i), "idx"))
                for (int64_t k = 0; k < n; k++) d[k] = (float)((s * 37 + k * 13) % 100);
        }
    return true;
}

static void free_sets(Sets *S) {
    for (int s = 0; s < NSETS; s++) {
        for (int i = 0; i < S->nin; i++) kiln_tensor_free(&S->in[s][i]);
        for (int i = 0; i < S->nout; i++) kiln_tensor_free(&S->want[s][i]);
    }
}

/* Each set run alone, checked against the interpreter; S->want keeps the
 * fused outputs. False (with the failure recorded) when one is off. */
static bool lone_runs(kiln_graph *g, kiln_program *p, Sets *S) {
    RtTolerance tol = rt_tolerance(rt_graph(kiln_program_rt(p)));
    for (int s = 0; s < NSETS; s++) {
        kiln_tensor ref[NOUT];
        if (kiln_program_run(p, S->in[s], S->want[s]) != KILN_OK) {
            test_failf(__FILE__, __LINE__, "set %d: %s", s, kiln_program_error(p));
            return false;
        }
        if (kiln_interpret(g, S->in[s], ref) != KILN_OK) {
            test_failf(__FILE__, __LINE__, "interpret: %s", kiln_error(g));
            return false;
        }
        for (int o = 0; o < S->nout; o++) {
            const float *got = S->want[s][o].data, *want = ref[o].data;
            for (int64_t k = 0; k < kiln_tensor_numel(&ref[o]); k++)
                if (!(rt_excess(got[k], want[k], tol) <= 1.0)) {
                    test_failf(__FILE__, __LINE__, "set %d %s[%lld]: fused %.8g, interpreter %.8g",
                               s, kiln_output_name(g, o), (long long)k, got[k], want[k]);
                    return false;
                }
            kiln_tensor_free(&ref[o]);
        }
    }
    return true;
}

typedef struct {
    kiln_program *p[2]; /* p[1]: NULL, or a second program run in turn */
    Sets *S[2];
    int id, runs;
    int wrong, failed; /* runs with an output off its set's lone run; failed calls */
    char first[256];   /* what the first wrong or failed run was */
} Worker;

static int run_one(Worker *w, int which, int s, kiln_tensor *out) {
    kiln_program *p = w->p[which];
    Sets *S = w->S[which];
    if (kiln_program_run_into(p, S->in[s], out) != KILN_OK) {
        if (!w->failed++ && !w->wrong)
            snprintf(w->first, sizeof w->first, "set %d: %s", s, kiln_program_error(p));
        return 0;
    }
    for (int o = 0; o < S->nout; o++)
        if (memcmp(out[o].data, S->want[s][o].data,
                   (size_t)kiln_tensor_numel(&out[o]) * sizeof(float))) {
            if (!w->wrong++ && !w->failed)
                snprintf(w->first, sizeof w->first, "thread %d, set %d: output %d differs", w->id,
                         s, o);
            return 0;
        }
    return 1;
}

static void *worker(void *arg) {
    Worker *w = arg;
    kiln_tensor out[2][NOUT];
    for (int k = 0; k < 2 && w->p[k]; k++)
        for (int o = 0; o < w->S[k]->nout; o++) {
            out[k][o] = w->S[k]->want[0][o];
            out[k][o].data = NULL;
            kiln_tensor_alloc(&out[k][o]);
        }
    for (int r = 0; r < w->runs; r++) {
        int which = w->p[1] && (r + w->id) % 2;
        run_one(w, which, (w->id * 5 + r * 3) % NSETS, out[which]);
    }
    for (int k = 0; k < 2 && w->p[k]; k++)
        for (int o = 0; o < w->S[k]->nout; o++) kiln_tensor_free(&out[k][o]);
    return NULL;
}

/* NTHREADS workers at once; the total of wrong and failed runs. */
static int run_workers(Worker *ws, int n) {
    pthread_t th[NTHREADS];
    for (int t = 0; t < n; t++) pthread_create(&th[t], NULL, worker, &ws[t]);
    for (int t = 0; t < n; t++) pthread_join(th[t], NULL);
    int bad = 0;
    for (int t = 0; t < n; t++) {
        EXPECT(!ws[t].wrong && !ws[t].failed, "thread %d: %d wrong, %d failed of %d (%s)", t,
               ws[t].wrong, ws[t].failed, ws[t].runs, ws[t].first);
        bad += ws[t].wrong + ws[t].failed;
    }
    return bad;
}

static kiln_program *compile_serving(kiln_graph *g, int threads) {
    kiln_options o = kiln_default_options();
    o.threads = threads;
    kiln_program *p = NULL;
    if (test_compile_in_cache(g, "serve", &o, &p) != KILN_OK)
        test_failf(__FILE__, __LINE__, "compile: %s", kiln_error(g));
    return p;
}

TEST(serve_one_program_many_threads) {
    kiln_graph *g = serve_graph();
    static Sets S;
    memset(&S, 0, sizeof S);
    CHECKF(!*kiln_error(g), "%s", kiln_error(g));
    kiln_program *p = compile_serving(g, 1);
    CHECK(p != NULL);
    CHECK(make_sets(g, &S));
    if (lone_runs(g, p, &S)) {
        Worker ws[NTHREADS];
        for (int round = 0; round < 2; round++) {
            for (int t = 0; t < NTHREADS; t++)
                ws[t] = (Worker){.p = {p, NULL}, .S = {&S, NULL}, .id = t, .runs = NRUNS};
            EXPECT(run_workers(ws, NTHREADS) == 0, "round %d", round);
        }
        /* one run state per run in flight at once, at most (the one made
         * at compile time is the first), and none made once they exist:
         * runs one after another reuse one */
        int made = rt_runs(kiln_program_rt(p));
        EXPECT(made >= 1 && made <= NTHREADS, "%d run states for %d callers", made, NTHREADS);
        Worker w = {.p = {p, NULL}, .S = {&S, NULL}, .id = 0, .runs = 100};
        worker(&w);
        EXPECT(!w.wrong && !w.failed, "sequential runs: %s", w.first);
        EXPECT(rt_runs(kiln_program_rt(p)) == made, "sequential runs made %d run states",
               rt_runs(kiln_program_rt(p)) - made);
    }
    free_sets(&S);
    kiln_program_free(p);
    kiln_graph_free(g);
}

TEST(serve_two_programs_interleaved) {
    kiln_graph *g = serve_graph(), *h = other_graph();
    static Sets S, T;
    memset(&S, 0, sizeof S);
    memset(&T, 0, sizeof T);
    kiln_program *p = compile_serving(g, 1), *q = compile_serving(h, 2);
    CHECK(p && q);
    CHECK(make_sets(g, &S) && make_sets(h, &T));
    EXPECT(kiln_program_threads(p) == 1 && kiln_program_threads(q) == 2, "threads %d, %d",
           kiln_program_threads(p), kiln_program_threads(q));
    if (lone_runs(g, p, &S) && lone_runs(h, q, &T)) {
        Worker ws[NTHREADS];
        for (int t = 0; t < NTHREADS; t++)
            ws[t] = (Worker){.p = {p, q}, .S = {&S, &T}, .id = t, .runs = NRUNS / 2};
        EXPECT(run_workers(ws, NTHREADS) == 0, "interleaved");
    }
    free_sets(&S);
    free_sets(&T);
    kiln_program_free(p);
    kiln_program_free(q);
    kiln_graph_free(g);
    kiln_graph_free(h);
}

/* Thread 0's runs have an index out of range; the others' must not see its
 * error, and it must see its own. */
typedef struct {
    kiln_program *p;
    Sets *S;
    bool bad;
    int ok, err, leaked;
} ErrWorker;

static void *err_worker(void *arg) {
    ErrWorker *w = arg;
    kiln_tensor in[NIN], out[NOUT];
    for (int i = 0; i < w->S->nin; i++) in[i] = w->S->in[0][i];
    float idx[20];
    memcpy(idx, w->S->in[0][2].data, sizeof idx);
    if (w->bad) idx[7] = 100; /* one past the table */
    in[2].data = idx;
    for (int o = 0; o < w->S->nout; o++) {
        out[o] = w->S->want[0][o];
        out[o].data = NULL;
        kiln_tensor_alloc(&out[o]);
    }
    for (int r = 0; r < 100; r++) {
        kiln_status st = kiln_program_run_into(w->p, in, out);
        const char *msg = kiln_program_error(w->p);
        if (w->bad)
            w->err += st == KILN_ERR_INPUT && strstr(msg, "100") != NULL;
        else
            w->ok += st == KILN_OK, w->leaked += *msg != 0;
    }
    for (int o = 0; o < w->S->nout; o++) kiln_tensor_free(&out[o]);
    return NULL;
}

TEST(serve_run_error_reaches_its_thread_only) {
    kiln_graph *g = serve_graph();
    static Sets S;
    memset(&S, 0, sizeof S);
    kiln_program *p = compile_serving(g, 1);
    CHECK(p != NULL);
    CHECK(make_sets(g, &S));
    CHECKF(!strcmp(kiln_input_name(g, 2), "idx"), "input 2 is %s", kiln_input_name(g, 2));
    if (lone_runs(g, p, &S)) {
        ErrWorker ws[NTHREADS];
        pthread_t th[NTHREADS];
        for (int t = 0; t < NTHREADS; t++) {
            ws[t] = (ErrWorker){.p = p, .S = &S, .bad = t == 0};
            pthread_create(&th[t], NULL, err_worker, &ws[t]);
        }
        for (int t = 0; t < NTHREADS; t++) pthread_join(th[t], NULL);
        EXPECT(ws[0].err == 100, "the bad thread saw its error %d of 100 times", ws[0].err);
        for (int t = 1; t < NTHREADS; t++)
            EXPECT(ws[t].ok == 100 && !ws[t].leaked, "thread %d: %d ok, %d with a message", t,
                   ws[t].ok, ws[t].leaked);
    }
    free_sets(&S);
    kiln_program_free(p);
    kiln_graph_free(g);
}
