/*
 * test_alloc.c -- allocation failure, everywhere.
 *
 * Every byte kiln allocates goes through one hook (kiln_set_allocator), so
 * a test can make the n-th allocation fail. For a representative program
 * (matmul, softmax, layer_norm, a reduction, a weight from randn) the
 * whole pipeline runs once with a counting hook to learn how many
 * allocations a successful run makes; then it runs again once for every n
 * from 1 to that count with allocation n refused. Each of those runs must
 * fail with KILN_ERR_NOMEM (never crash, never report success with a
 * missing result) and, once everything is freed, hold no live block.
 *
 * Two pipelines: parse + interpret (the reference path), and parse +
 * compile + run (decompose, lower, schedule, codegen, JIT, memory plan).
 * The compiled pipeline is split at kiln_compile's return, so a bug in the
 * compiler's stages and one in running are told apart. It uses a JIT cache
 * of its own, warmed once, so each n is a cache hit and no C compiler runs
 * inside the loop.
 */
#include "test.h"
#include "runtime/runtime.h"
#include "graph/graph.h"
#include <stdbool.h>
#include <stdint.h>
#include <unistd.h>

static const char *prog = "input x: f32[4, 8]\n"
                          "weight w: f32[8, 8] = randn(1)\n"
                          "h = x @ w\n"
                          "s = softmax(h, dim=-1)\n"
                          "y = layer_norm(s + x, [8])\n"
                          "m = sum(relu(y), dim=1)\n"
                          "output y, m\n";

/* The hook: counts requests, refuses request number fail_at, and keeps
 * the live blocks (so a leak can be counted, then freed: LeakSanitizer
 * would otherwise fail the whole ASan run for it). */
#define MAX_LIVE 4096
typedef struct {
    long requests; /* allocations and growths so far */
    long fail_at;  /* refuse this request (0: never) */
    long mark;     /* requests made when kiln_compile returned */
    int nlive;     /* blocks allocated and not yet freed */
    void *live[MAX_LIVE];
} Hook;

static Hook *cur; /* the hook in use, for run_compiled's mark */

static void forget(Hook *h, void *p) {
    for (int i = h->nlive - 1; i >= 0; i--)
        if (h->live[i] == p) {
            h->live[i] = h->live[--h->nlive];
            return;
        }
    abort(); /* freeing a block this hook never handed out */
}

static void *counting_alloc(void *ud, void *ptr, size_t old, size_t n) {
    Hook *h = ud;
    (void)old;
    if (n == 0) {
        if (ptr) forget(h, ptr);
        free(ptr);
        return NULL;
    }
    if (++h->requests == h->fail_at) return NULL;
    if (!ptr && h->nlive == MAX_LIVE) return NULL;
    if (ptr) forget(h, ptr);
    void *p = realloc(ptr, n);
    h->live[h->nlive++] = p ? p : ptr; /* a failed realloc keeps the block */
    return p;
}

/* Free what a run leaked (after counting it). */
static void free_leaks(Hook *h) {
    for (int i = 0; i < h->nlive; i++) free(h->live[i]);
    h->nlive = 0;
}

typedef kiln_status (*Pipeline)(char *msg, size_t len);

/* Parse the program and make its input (seeded normal values). */
static kiln_status load(kiln_graph **g, kiln_tensor *in) {
    *g = kiln_graph_new();
    if (!*g) return KILN_ERR_NOMEM;
    kiln_status st = kiln_parse(*g, prog, "alloc.kiln");
    if (st != KILN_OK) return st;
    in[0] = kiln_input_desc(*g, 0);
    st = kiln_tensor_alloc(&in[0]);
    if (st == KILN_OK) kiln_fill_randn(in[0].data, kiln_tensor_numel(&in[0]), 3);
    return st;
}

/* A successful run must deliver every output. */
static kiln_status finish(kiln_status st, kiln_tensor *out, int nout) {
    for (int i = 0; st == KILN_OK && i < nout; i++)
        if (!out[i].data) st = KILN_ERR_INPUT; /* reported as a wrong status */
    for (int i = 0; i < nout; i++) kiln_tensor_free(&out[i]);
    return st;
}

static kiln_status run_interpret(char *msg, size_t len) {
    kiln_graph *g = NULL;
    kiln_tensor in[1] = {0}, out[2] = {{0}, {0}};
    kiln_status st = load(&g, in);
    if (st == KILN_OK) st = kiln_interpret(g, in, out);
    st = finish(st, out, 2);
    snprintf(msg, len, "%s", g ? kiln_error(g) : "kiln_graph_new failed");
    kiln_tensor_free(&in[0]);
    kiln_graph_free(g);
    return st;
}

static kiln_status run_compiled(char *msg, size_t len) {
    kiln_graph *g = NULL;
    kiln_program *p = NULL;
    kiln_tensor in[1] = {0}, out[2] = {{0}, {0}};
    kiln_status st = load(&g, in);
    if (st == KILN_OK) st = kiln_compile(g, 0, &p);
    if (cur) cur->mark = cur->requests;
    if (st == KILN_OK) st = kiln_program_run(p, in, out);
    st = finish(st, out, 2);
    snprintf(msg, len, "%s", p ? kiln_program_error(p) : g ? kiln_error(g) : "no graph");
    kiln_program_free(p);
    kiln_tensor_free(&in[0]);
    kiln_graph_free(g);
    return st;
}

/* Run fn with the hook; returns its status, the hook holds the counts. */
static kiln_status with_hook(Pipeline fn, Hook *h, char *msg, size_t len) {
    cur = h;
    kiln_set_allocator(counting_alloc, h);
    kiln_status st = fn(msg, len);
    kiln_set_allocator(NULL, NULL);
    cur = NULL;
    return st;
}

/* Refuse allocation n, for every n in [lo, hi], in turn: each run must
 * fail with KILN_ERR_NOMEM and leave no live block. Prints the range
 * covered (an indented line, which tests/run.sh shows). */
static void fail_range(const char *what, Pipeline fn, long lo, long hi) {
    int bad = 0;
    char msg[1024];
    for (long n = lo; n <= hi && bad < 5; n++) {
        Hook h = {.fail_at = n};
        kiln_status st = with_hook(fn, &h, msg, sizeof msg);
        int leaked = h.nlive;
        free_leaks(&h);
        if (st == KILN_ERR_NOMEM && leaked == 0) continue;
        test_failf(__FILE__, __LINE__,
                   "%s: allocation %ld refused: status %d (want %d, "
                   "out of memory), %d blocks leaked: %s",
                   what, n, (int)st, (int)KILN_ERR_NOMEM, leaked, msg);
        bad++;
    }
    printf("  (%s: refused each of allocations %ld..%ld in turn)\n", what, lo, hi);
}

/* The clean run: must succeed and free everything. */
static bool clean_run(Pipeline fn, Hook *h) {
    char msg[1024];
    kiln_status st = with_hook(fn, h, msg, sizeof msg);
    int leaked = h->nlive;
    free_leaks(h);
    EXPECT(st == KILN_OK, "the clean run failed with status %d: %s", (int)st, msg);
    EXPECT(leaked == 0, "the clean run leaks %d blocks", leaked);
    return st == KILN_OK && leaked == 0 && h->requests > 10;
}

TEST(alloc_fail_each_interpret) {
    Hook clean = {0};
    if (!clean_run(run_interpret, &clean)) return;
    fail_range("parse + interpret", run_interpret, 1, clean.requests);
}

/* The JIT cache of these tests: fresh, under the test's scratch
 * directory, warmed by one run so no n ever starts the C compiler. */
static char saved_cache[1024];
static int had_cache;

static bool use_own_cache(void) {
    const char *c = getenv("KILN_CACHE_DIR");
    had_cache = c != NULL;
    snprintf(saved_cache, sizeof saved_cache, "%s", c ? c : "");
    char dir[512], msg[1024];
    snprintf(dir, sizeof dir, "%s/alloc_cache", test_tmpdir());
    setenv("KILN_CACHE_DIR", dir, 1);
    kiln_status st = run_compiled(msg, sizeof msg); /* default allocator */
    EXPECT(st == KILN_OK, "the warm-up compile failed with status %d: %s", (int)st, msg);
    return st == KILN_OK;
}

static void restore_cache(void) {
    if (had_cache)
        setenv("KILN_CACHE_DIR", saved_cache, 1);
    else
        unsetenv("KILN_CACHE_DIR");
}

/* Allocations of parse + kiln_compile: decompose, lower, schedule,
 * codegen, the JIT (a cache hit) and the memory plan. */
TEST(alloc_fail_each_compile) {
    Hook clean = {0};
    if (use_own_cache() && clean_run(run_compiled, &clean))
        fail_range("parse + compile", run_compiled, 1, clean.mark);
    restore_cache();
}

/* Allocations of kiln_program_run and the frees after it. */
TEST(alloc_fail_each_program_run) {
    Hook clean = {0};
    if (use_own_cache() && clean_run(run_compiled, &clean))
        fail_range("program run", run_compiled, clean.mark + 1, clean.requests);
    restore_cache();
}

/* ---- tensor data on cache lines ----------------------------------------- */

/* A hook whose blocks start 16 bytes past a cache line (malloc's alignment,
 * which kiln.h asks of a hook, and no more), and that counts the bytes it
 * holds. */
typedef struct {
    long long held;
} OddHook;

static void *odd_alloc(void *ud, void *ptr, size_t old, size_t n) {
    OddHook *h = ud;
    char *real = ptr ? (char *)ptr - 16 : NULL;
    char *p = NULL;
    if (n && !(p = aligned_alloc(64, (n + 16 + 63) / 64 * 64))) return NULL;
    if (p && real) memcpy(p + 16, ptr, old < n ? old : n);
    free(real);
    h->held += (long long)n - (long long)old;
    return p ? p + 16 : NULL;
}

/* Checks every tensor size of `sizes` starts on a KILN_ALIGN line and can
 * be written whole (ASan: no overrun), then is freed. */
static void check_lines(const char *who) {
    static const int64_t sizes[] = {1, 3, 17, 1000, 1 << 20, (5 << 20) + 3};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        kiln_tensor t = {KILN_F32, 1, {sizes[i]}, NULL};
        CHECK(kiln_tensor_alloc(&t) == KILN_OK);
        EXPECT((uintptr_t)t.data % KILN_ALIGN == 0, "%s: %lld floats at %p, not on a line", who,
               (long long)sizes[i], t.data);
        memset(t.data, 0x5a, (size_t)sizes[i] * sizeof(float));
        kiln_tensor_free(&t);
    }
}

/* kiln_tensor_alloc's data and a weight's data start on a cache line
 * (util.c: a 512-bit load from a row that starts mid-line touches two
 * lines), whatever line offset the allocation hook's blocks have, and
 * freeing gives back every byte. */
TEST(alloc_tensor_data_on_cache_lines) {
    check_lines("default allocator");
    OddHook h = {0};
    kiln_set_allocator(odd_alloc, &h);
    check_lines("hook 16 bytes past a line");
    kiln_graph *g = kiln_graph_new();
    CHECK(g != NULL);
    static const float ones[7] = {1, 1, 1, 1, 1, 1, 1};
    for (int k = 1; k <= 7; k++) {
        int64_t shape[1] = {k};
        char name[16];
        snprintf(name, sizeof name, "w%d", k);
        kiln_value v = kiln_weight(g, name, 1, shape, ones);
        CHECKF(v >= 0, "%s", kiln_error(g));
        const float *d = g->nodes[v].data;
        EXPECT((uintptr_t)d % KILN_ALIGN == 0, "weight %s at %p, not on a line", name, (void *)d);
        EXPECT(d[k - 1] == 1.0f, "weight %s lost its data", name);
    }
    kiln_graph_free(g);
    kiln_set_allocator(NULL, NULL);
    EXPECT(h.held == 0, "the hook still holds %lld bytes", h.held);
}
