/*
 * runtime.c -- the compiled program.   requires: a graph; gives: an object
 * that runs the graph's fused kernels, and the public kiln_compile /
 * kiln_program_* API.
 *
 * rt_compile is the whole pipeline in order: plan_build (decompose, lower,
 * schedule), cg_generate (C source), jit_compile (cc + dlopen, cached), then
 * memory planning. A run hands the generated kiln_entry one pointer per
 * buffer: inputs and outputs are the caller's arrays, weights the graph's
 * data (the plan keeps its own copy of the graph), and every intermediate
 * buffer a slice of one arena.
 *
 * Memory planning: a buffer lives from the call that writes it to the last
 * call that reads it (inclusive: a kernel never reads and writes the same
 * memory through two names, which keeps `restrict` true). Buffers are
 * placed largest first, each at the lowest 64-byte aligned offset that
 * overlaps no placed buffer live at the same time, so a dead buffer's
 * memory is reused. The peak reported is inputs + outputs + arena; weights
 * are constants of the program and not counted.
 *
 * Sharing: a compiled program is immutable once compiled, and any number
 * of threads may run it at once. What a run writes (the arena of
 * intermediates and the table of buffer pointers) is an RtRun taken from
 * the program's pool for the run and given back after it, so a serving
 * loop allocates nothing once the pool holds as many runs as there are
 * concurrent callers; the first is made at compile time. Constant weights
 * (and the library's packed or reordered copies of them) are only read.
 *
 * Threads: the kernels and OpenBLAS share the calling thread's OpenMP
 * team (see externs/matmul.c). rt_run sizes it for the run only
 * (omp_set_num_threads sets the calling thread's value), so programs with
 * different counts, called from different threads, do not change each
 * other's; the size is the program's count or fewer, whichever its recent
 * runs measured faster (team.c), and rt_run times every run for that.
 *
 * Shapes: a program from an ONNX model with symbolic dims keeps the model
 * and compiles other input shapes on first use (for_shapes, below).
 *
 * Large fresh memory (the arena; outputs kiln_program_run allocates and
 * every other tensor through kiln_tensor_alloc) is advised MADV_HUGEPAGE
 * (util_advise_huge): its pages fault in during the first kernel that
 * writes them, and 2 MiB pages take 512 times fewer faults than 4 KiB
 * ones (Linux with transparent huge pages on "madvise" or "always").
 */
#include "runtime/runtime.h"
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define RT_ALIGN KILN_ALIGN

struct RtProgram {
    Plan *plan; /* owns the decomposed graph (and weight data) */
    CgOutput code;
    JitLib *lib;     /* NULL when borrowed (rt_compile_many) or no calls */
    KilnEntry entry; /* NULL: nothing to call (outputs are copies) */
    int nbufs;
    int64_t *offset;           /* per buffer: arena offset, or -1 */
    bool *direct;              /* per output: kiln_entry writes the caller's array */
    int threads;               /* the OpenMP team of a run; 0: the caller's as it is */
    pthread_mutex_t runs_lock; /* the pool and the team */
    RtTeam team;               /* each run's team size (team.c) */
    struct RtRun *free_runs;   /* the pool: runs not in use */
    int nruns;                 /* runs made, in use or not */
    RtStats stats;
    RtProf *prof;     /* NULL: not profiling */
    RtProgram **subs; /* per buffer, two each: a call's compiled bodies (NULL: none) */
};

/* What one run writes: the arena of intermediates and the pointer table
 * kiln_entry gets. One per concurrent run of a program. */
typedef struct RtRun {
    struct RtRun *next;       /* in the free list */
    unsigned char *arena_raw; /* kmalloc'd; arena is it aligned */
    unsigned char *arena;
    float **bufs;
} RtRun;

static const KilnRT rt_externs = {.mm = ext_matmul_epi,
                                  .conv2d = ext_conv2d_epi,
                                  .gather = ext_gather,
                                  .conv_transpose2d = ext_conv_transpose2d,
                                  .conv2d_const = ext_conv2d_const_epi,
                                  .mm_const = ext_matmul_const_epi,
                                  .mm64 = ext_matmul64};
#ifdef KILN_TESTING
#include "testing.h"
static KilnRT rt_test_table; /* rt_set_externs: a test's table */
static bool rt_test_set;

void rt_set_externs(const KilnRT *rt) {
    rt_test_set = rt != NULL;
    if (!rt) return;
    rt_test_table = *rt;
    KilnRT *t = &rt_test_table;
    if (!t->mm) t->mm = rt_externs.mm;
    if (!t->conv2d) t->conv2d = rt_externs.conv2d;
    if (!t->gather) t->gather = rt_externs.gather;
    if (!t->conv_transpose2d) t->conv_transpose2d = rt_externs.conv_transpose2d;
    if (!t->conv2d_const) t->conv2d_const = t->conv2d;
    if (!t->mm_const) t->mm_const = t->mm;
    if (!t->mm64) t->mm64 = rt_externs.mm64;
}
#endif

static int64_t buf_bytes(const Buffer *b) { return b->numel * loop_storage_size(b->dtype); }

static int64_t align_up(int64_t n) { return (n + RT_ALIGN - 1) / RT_ALIGN * RT_ALIGN; }

/* ===== threads ============================================================= */

/* $KILN_NUM_THREADS as a count, or 0 when unset; a value that is not a
 * positive integer is reported (once) and ignored, as libgomp does with a
 * bad OMP_NUM_THREADS. */
static int env_threads(void) {
    const char *env = getenv("KILN_NUM_THREADS");
    if (!env || !*env) return 0;
    char *end;
    errno = 0;
    long v = strtol(env, &end, 10);
    if (!errno && end != env && !*end && v > 0 && v <= INT_MAX) return (int)v;
    static int warned;
    if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
        fprintf(stderr,
                "kiln: warning: KILN_NUM_THREADS=%s is not a positive integer; "
                "using every core (%d)\n",
                env, omp_get_num_procs());
    return 0;
}

int rt_resolve_threads(int n) {
    if (n <= 0) n = env_threads();
    int cores = omp_get_num_procs();
    static int warned;
    if (n > cores && !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
        fprintf(stderr,
                "kiln: warning: %d threads on %d cores: each run's threads wait for one "
                "another; %d is faster\n",
                n, cores, cores);
    return n > 0 ? n : cores;
}

int rt_set_threads(int n) {
    ext_set_threads(rt_resolve_threads(n));
    return ext_get_threads();
}

/* ===== memory planning ====================================================== */

typedef struct {
    int buf;
    int first, last; /* calls */
    int64_t size, offset;
} Slot;

static int slot_cmp(const void *a, const void *b) {
    const Slot *x = a, *y = b;
    if (x->size != y->size) return x->size > y->size ? -1 : 1;
    return x->buf - y->buf;
}

/* The lowest offset where s fits beside the placed slots live with it. */
static int64_t first_fit(const Slot *placed, int n, const Slot *s) {
    int64_t off = 0;
    for (bool moved = true; moved;) {
        moved = false;
        for (int i = 0; i < n; i++) {
            const Slot *o = &placed[i];
            bool live = o->first <= s->last && s->first <= o->last;
            bool hits = off < o->offset + o->size && o->offset < off + s->size;
            if (live && hits) {
                off = align_up(o->offset + o->size);
                moved = true;
            }
        }
    }
    return off;
}

/* First and last call touching each buffer. */
static void live_ranges(const RtProgram *p, int *first, int *last) {
    for (int b = 0; b < p->nbufs; b++) first[b] = last[b] = -1;
    for (int c = 0; c < p->code.ncalls; c++) {
        const CgCall *call = &p->code.calls[c];
        for (int i = 0; i < call->nbufs; i++) {
            int b = call->bufs[i];
            if (first[b] < 0) first[b] = c;
            last[b] = c;
        }
    }
}

static bool in_arena(const Buffer *b, int first) {
    return buf_computed(b) && !b->is_output && first >= 0;
}

static kiln_status plan_memory(RtProgram *p, char *err, size_t errlen) {
    const LoopProgram *lp = p->plan->prog;
    int *first = kcalloc((size_t)p->nbufs + 1, sizeof(int));
    int *last = kcalloc((size_t)p->nbufs + 1, sizeof(int));
    Slot *slots = kcalloc((size_t)p->nbufs + 1, sizeof(Slot));
    p->offset = kcalloc((size_t)p->nbufs + 1, sizeof(int64_t));
    if (!first || !last || !slots || !p->offset) {
        kfree(first), kfree(last), kfree(slots);
        util_fmt(err, errlen, "out of memory");
        return KILN_ERR_NOMEM;
    }
    live_ranges(p, first, last);
    int n = 0;
    for (int b = 0; b < p->nbufs; b++) {
        p->offset[b] = -1;
        if (!in_arena(lp->bufs[b], first[b])) continue;
        slots[n++] = (Slot){b, first[b], last[b], align_up(buf_bytes(lp->bufs[b])), 0};
        p->stats.intermediate_bytes += buf_bytes(lp->bufs[b]);
    }
    qsort(slots, (size_t)n, sizeof(Slot), slot_cmp);
    for (int i = 0; i < n; i++) {
        slots[i].offset = first_fit(slots, i, &slots[i]);
        p->offset[slots[i].buf] = slots[i].offset;
        if (slots[i].offset + slots[i].size > p->stats.arena_bytes)
            p->stats.arena_bytes = slots[i].offset + slots[i].size;
    }
    kfree(first), kfree(last), kfree(slots);
    return KILN_OK;
}

static void io_bytes(RtProgram *p) {
    const LoopProgram *lp = p->plan->prog;
    for (int i = 0; i < lp->ninputs; i++) p->stats.io_bytes += buf_bytes(lp->bufs[lp->inputs[i]]);
    for (int i = 0; i < lp->noutputs; i++) p->stats.io_bytes += buf_bytes(lp->bufs[lp->outputs[i]]);
    p->stats.peak_bytes = p->stats.io_bytes + p->stats.arena_bytes;
}

/* Outputs kiln_entry writes straight into the caller's array: computed, and
 * the first output naming that buffer. The others are copied after a run. */
static void mark_direct(RtProgram *p) {
    const LoopProgram *lp = p->plan->prog;
    for (int i = 0; i < lp->noutputs; i++) {
        int b = lp->outputs[i];
        p->direct[i] = buf_computed(lp->bufs[b]);
        for (int j = 0; j < i; j++)
            if (lp->outputs[j] == b) p->direct[i] = false;
    }
}

static void run_free(RtRun *r) {
    if (!r) return;
    kfree(r->arena_raw);
    kfree(r->bufs);
    kfree(r);
}

/* A new run's memory; NULL when out of memory. */
static RtRun *run_new(const RtProgram *p) {
    RtRun *r = kcalloc(1, sizeof *r);
    if (!r) return NULL;
    r->bufs = kcalloc((size_t)p->nbufs + 1, sizeof(float *));
    if (p->stats.arena_bytes) r->arena_raw = kmalloc((size_t)p->stats.arena_bytes + RT_ALIGN);
    if (!r->bufs || (p->stats.arena_bytes && !r->arena_raw)) {
        run_free(r);
        return NULL;
    }
    if (r->arena_raw) r->arena = util_on_line(r->arena_raw);
    util_advise_huge(r->arena_raw, (size_t)p->stats.arena_bytes + RT_ALIGN);
    return r;
}

/* A run from the pool, or a new one when all are in use. */
static RtRun *run_take(RtProgram *p) {
    pthread_mutex_lock(&p->runs_lock);
    RtRun *r = p->free_runs;
    if (r)
        p->free_runs = r->next;
    else
        p->nruns++;
    pthread_mutex_unlock(&p->runs_lock);
    if (r) return r;
    if ((r = run_new(p))) return r;
    pthread_mutex_lock(&p->runs_lock);
    p->nruns--;
    pthread_mutex_unlock(&p->runs_lock);
    return NULL;
}

static void run_give(RtProgram *p, RtRun *r) {
    pthread_mutex_lock(&p->runs_lock);
    r->next = p->free_runs;
    p->free_runs = r;
    pthread_mutex_unlock(&p->runs_lock);
}

static kiln_status alloc_run_state(RtProgram *p, char *err, size_t errlen) {
    p->direct = kcalloc((size_t)p->plan->prog->noutputs + 1, sizeof(bool));
    RtRun *r = p->direct ? run_take(p) : NULL;
    if (!r) {
        util_fmt(err, errlen, "out of memory: %lld bytes of arena",
                 (long long)p->stats.arena_bytes);
        return KILN_ERR_NOMEM;
    }
    run_give(p, r); /* the first run's memory, made now */
    mark_direct(p);
    return KILN_OK;
}

/* ===== compiling ================================================================ */

/* KILN_LOGS=output_code (or all) prints the generated source. */
static bool log_output_code(void) {
    const char *env = getenv("KILN_LOGS");
    if (!env) return false;
    for (const char *s = env; *s;) {
        size_t n = strcspn(s, ",");
        if ((n == 11 && !strncmp(s, "output_code", 11)) || (n == 3 && !strncmp(s, "all", 3)))
            return true;
        s += n + (s[n] == ',');
    }
    return false;
}

static kiln_status plan_and_generate(const Graph *g, const KilnConfig *cfg, const CgOptions *opt,
                                     RtProgram **out, char *err, size_t errlen) {
    RtProgram *p = kcalloc(1, sizeof *p);
    *out = p;
    if (!p) {
        util_fmt(err, errlen, "out of memory");
        return KILN_ERR_NOMEM;
    }
    pthread_mutex_init(&p->runs_lock, NULL);
    rt_team_init(&p->team, 0, true);
    Target t = cfg ? cfg->target : kiln_config_default().target;
    util_fmt(p->stats.jit_flags, sizeof p->stats.jit_flags, "%s %s", CG_EXTRA_FLAGS, t.flags);
    p->stats.target = t.name;
    /* the library paths explain names follow the tier */
    unsigned prev = ext_isa_enter(t.ext);
    double t0 = util_now_ms();
    kiln_status st = plan_build(g, cfg, &p->plan, err, errlen);
    double t1 = util_now_ms();
    if (st == KILN_OK) st = cg_generate_opts(p->plan->sched, opt, &p->code, err, errlen);
    p->stats.plan_ms = t1 - t0;
    p->stats.codegen_ms = util_now_ms() - t1;
    ext_isa_leave(prev);
    if (st != KILN_OK) return st;
    p->nbufs = p->plan->prog->nbufs;
    p->stats.ncalls = p->code.ncalls;
    if (log_output_code()) {
        FILE *f = cfg && cfg->log ? cfg->log : stderr;
        fprintf(f, "%s", p->code.source);
    }
    return KILN_OK;
}

/* ---- calls of sub-programs (control flow) -------------------------------------- */

/* Each call's bodies, compiled with the program's configuration; they run
 * on the team of the run that calls them. */
static kiln_status compile_subs(RtProgram *p, char *err, size_t errlen) {
    const LoopProgram *lp = p->plan->prog;
    for (int b = 0; b < lp->nbufs; b++) {
        const GraphCall *c = lp->bufs[b]->call;
        if (!c) continue;
        if (!p->subs && !(p->subs = kcalloc((size_t)lp->nbufs * 2, sizeof(RtProgram *)))) {
            util_fmt(err, errlen, "out of memory");
            return KILN_ERR_NOMEM;
        }
        for (int k = 0; k < 2; k++) {
            if (!c->body[k]) continue;
            char msg[1024];
            kiln_status st =
                rt_compile(c->body[k], &p->plan->sched->cfg, &p->subs[2 * b + k], msg, sizeof msg);
            if (st != KILN_OK) {
                util_fmt(err, errlen, "%s, %s: %s", c->label ? c->label : "call",
                         graph_call_part(c, k), msg);
                return st;
            }
            const RtStats *ss = &p->subs[2 * b + k]->stats; /* the compile's time is theirs too */
            p->stats.compile_ms += ss->compile_ms;
            p->stats.load_ms += ss->load_ms;
            p->stats.jit_units += ss->jit_units;
            p->stats.cache_hit = p->stats.cache_hit && ss->cache_hit;
        }
    }
    return KILN_OK;
}

/* One run of a body; its message, if any, names the call. */
static kiln_status sub_run(RtProgram *sub, const GraphCall *c, void *const *in, void **out,
                           char *err, size_t errlen) {
    char msg[1024];
    kiln_status st = rt_run(sub, (const float *const *)in, (float **)out, msg, sizeof msg);
    if (st != KILN_OK) util_fmt(err, errlen, "%s: %s", c->label ? c->label : "call", msg);
    return st;
}

/* Body b's input or output k, in bytes. */
static int64_t sub_bytes(const RtProgram *sub, bool output, int k) {
    const LoopProgram *lp = sub->plan->prog;
    return buf_bytes(lp->bufs[output ? lp->outputs[k] : lp->inputs[k]]);
}

static kiln_status call_if(RtProgram **subs, const GraphCall *c, const unsigned char *in,
                           unsigned char *out, size_t es, void **ptrs, char *err, size_t errlen) {
    bool f64 = es == sizeof(double);
    int b = (f64 ? *(const double *)in : *(const float *)in) != 0 ? 0 : 1;
    RtProgram *B = subs[b];
    if (!B) {
        graph_call_refusal(c, b, err, errlen);
        return KILN_ERR_INPUT;
    }
    const LoopProgram *lp = B->plan->prog;
    const unsigned char *p = in + es;
    for (int k = 0; b && subs[0] && k < subs[0]->plan->prog->ninputs; k++)
        p += sub_bytes(subs[0], false, k);
    void **bin = ptrs, **bout = ptrs + lp->ninputs;
    for (int k = 0; k < lp->ninputs; k++) {
        bin[k] = (void *)p;
        p += sub_bytes(B, false, k);
    }
    for (int k = 0; k < lp->noutputs; k++) {
        bout[k] = out;
        out += sub_bytes(B, true, k);
    }
    return sub_run(B, c, bin, bout, err, errlen);
}

/* ONNX Loop and Scan (graph.h, GraphCall; the interpreter's eval_loop is
 * the reference): the states ping-pong between the value's two places, the
 * scan slices are read and written in place. */
static kiln_status call_loop(RtProgram *B, const GraphCall *c, const unsigned char *in,
                             unsigned char *out, size_t es, void **ptrs, char *err, size_t errlen) {
    bool f64 = es == sizeof(double);
    const LoopProgram *lp = B->plan->prog;
    int fi = c->loop ? 2 : 0, fo = c->loop ? 1 : 0, ncap = graph_call_ncap(c, 0);
    int64_t trips = c->trips, S = 0, scans_out = 0;
    bool go = true;
#define RD(ptr) (f64 ? *(const double *)(ptr) : (double)*(const float *)(ptr))
    if (c->has_trip) trips = graph_call_trips(RD(in)), in += es;
    if (c->has_cond) go = RD(in) != 0, in += es;
    for (int k = 0; k < c->nstate; k++) S += sub_bytes(B, false, fi + k);
    for (int k = 0; k < c->nscan_out; k++)
        scans_out += c->trips * sub_bytes(B, true, fo + c->nstate + k);
    const unsigned char *state_in = in, *scan_in = in + S, *caps = scan_in;
    for (int m = 0; m < c->nscan_in; m++)
        caps += c->trips * sub_bytes(B, false, fi + c->nstate + m);
    unsigned char *tmp = out + S + scans_out, *iter = tmp + S, *cin = iter + es, *cout = cin + es;
    void **bin = ptrs, **bout = ptrs + lp->ninputs;
    const unsigned char *R = state_in;
    unsigned char *W = tmp;
    kiln_status st = KILN_OK;
    for (int64_t i = 0; st == KILN_OK && go && (trips < 0 || i < trips); i++) {
        int a = 0, o = 0;
        if (c->loop) {
            if (f64)
                *(double *)iter = (double)i, *(double *)cin = 1;
            else
                *(float *)iter = (float)i, *(float *)cin = 1;
            bin[a++] = iter, bin[a++] = cin, bout[o++] = cout;
        }
        int64_t off = 0;
        for (int k = 0; k < c->nstate; k++) {
            bin[a++] = (void *)(R + off);
            bout[o++] = W + off;
            off += sub_bytes(B, false, fi + k);
        }
        const unsigned char *sp = scan_in;
        for (int m = 0; m < c->nscan_in; m++) {
            int64_t sl = sub_bytes(B, false, a);
            bin[a++] = (void *)(sp + i * sl);
            sp += c->trips * sl;
        }
        unsigned char *so = out + S;
        for (int k = 0; k < c->nscan_out; k++) {
            int64_t sl = sub_bytes(B, true, o);
            bout[o++] = so + i * sl;
            so += c->trips * sl;
        }
        const unsigned char *cp = caps;
        for (int k = 0; k < ncap; k++) {
            bin[a] = (void *)cp;
            cp += sub_bytes(B, false, a++);
        }
        st = sub_run(B, c, bin, bout, err, errlen);
        if (c->loop) go = RD(cout) != 0;
        R = W;
        W = W == tmp ? out : tmp;
    }
#undef RD
    if (st == KILN_OK && R != out && S) memcpy(out, R, (size_t)S);
    return st;
}

/* KilnRT.call: the generated entry point hands over call `site`. */
static int rt_call(void *prog, int site, const void *in, void *out, char *err, size_t errlen) {
    RtProgram *p = prog;
    const Buffer *b = p->plan->prog->bufs[site];
    const GraphCall *c = b->call;
    RtProgram **subs = p->subs + 2 * site;
    int n = 0; /* the most pointers a body takes: its inputs and outputs */
    for (int k = 0; k < 2; k++) {
        int m = subs[k] ? subs[k]->plan->prog->ninputs + subs[k]->plan->prog->noutputs : 0;
        if (m > n) n = m;
    }
    void **ptrs = kcalloc((size_t)n + 1, sizeof(void *));
    if (!ptrs) return 1;
    size_t es = (size_t)loop_storage_size(b->dtype);
    kiln_status st = c->kind == CALL_IF ? call_if(subs, c, in, out, es, ptrs, err, errlen)
                                        : call_loop(subs[0], c, in, out, es, ptrs, err, errlen);
    kfree(ptrs);
    return st == KILN_OK ? 0 : st == KILN_ERR_INPUT ? EXT_ERR_INPUT : 1;
}

static kiln_status finish(RtProgram *p, char *err, size_t errlen) {
    kiln_status st = compile_subs(p, err, errlen);
    if (st == KILN_OK) st = plan_memory(p, err, errlen);
    if (st == KILN_OK) st = alloc_run_state(p, err, errlen);
    io_bytes(p);
    return st;
}

static void set_jit_stats(RtProgram *p, const JitStats *js, double ms) {
    p->stats.cache_hit = js->cache_hit;
    p->stats.jit_units = js->units;
    p->stats.compile_ms = js->compile_ms;
    p->stats.load_ms = ms;
}

static kiln_status load_entry(RtProgram *p, JitLib *lib, char *err, size_t errlen) {
    p->entry = (KilnEntry)jit_sym(lib, p->code.entry);
    if (p->entry) return KILN_OK;
    util_fmt(err, errlen, "jit: %s not found in the compiled program", p->code.entry);
    return KILN_ERR_ENV;
}

kiln_status rt_compile(const Graph *g, const KilnConfig *cfg, RtProgram **out, char *err,
                       size_t errlen) {
    RtProgram *p;
    *out = NULL;
    kiln_status st = plan_and_generate(g, cfg, NULL, &p, err, errlen);
    if (st == KILN_OK && p->code.ncalls > 0) {
        JitStats js;
        double t0 = util_now_ms();
        st = jit_compile(p->code.source, p->stats.jit_flags, &p->lib, err, errlen, &js);
        if (st == KILN_OK) set_jit_stats(p, &js, util_now_ms() - t0);
        if (st == KILN_OK) st = load_entry(p, p->lib, err, errlen);
    }
    if (st == KILN_OK) st = finish(p, err, errlen);
    if (st != KILN_OK) {
        rt_free(p);
        return st;
    }
    *out = p;
    return KILN_OK;
}

/* One source: the prelude once, then each program's kernels under its own
 * prefix. */
static kiln_status batch_source(RtProgram **ps, int n, char **src, char *err, size_t errlen) {
    char *pre;
    kiln_status st = cg_prelude(&pre, err, errlen);
    if (st != KILN_OK) return st;
    size_t len = strlen(pre) + 1;
    for (int i = 0; i < n; i++) len += ps[i]->code.len + 1;
    if (!(*src = kmalloc(len))) {
        kfree(pre);
        util_fmt(err, errlen, "out of memory");
        return KILN_ERR_NOMEM;
    }
    size_t at = (size_t)snprintf(*src, len, "%s", pre);
    for (int i = 0; i < n; i++)
        at += (size_t)snprintf(*src + at, len - at, "\n%s", ps[i]->code.source);
    kfree(pre);
    return KILN_OK;
}

static kiln_status compile_batch(RtProgram **ps, int n, JitLib **lib, char *err, size_t errlen) {
    char *src;
    kiln_status st0 = batch_source(ps, n, &src, err, errlen);
    if (st0 != KILN_OK) return st0;
    JitStats js;
    double t0 = util_now_ms();
    kiln_status st = jit_compile(src, ps[0]->stats.jit_flags, lib, err, errlen, &js);
    double ms = util_now_ms() - t0;
    kfree(src);
    for (int i = 0; st == KILN_OK && i < n; i++) {
        set_jit_stats(ps[i], &js, ms);
        if (ps[i]->code.ncalls > 0) st = load_entry(ps[i], *lib, err, errlen);
    }
    return st;
}

kiln_status rt_compile_many(const Graph *const *gs, int n, const KilnConfig *cfg, RtProgram **out,
                            JitLib **lib, char *err, size_t errlen) {
    kiln_status st = KILN_OK;
    *lib = NULL;
    memset(out, 0, sizeof(RtProgram *) * (size_t)n);
    for (int i = 0; st == KILN_OK && i < n; i++) {
        char prefix[32];
        util_fmt(prefix, sizeof prefix, "p%d_", i);
        CgOptions opt = {prefix, true, false};
        st = plan_and_generate(gs[i], cfg, &opt, &out[i], err, errlen);
    }
    if (st == KILN_OK) st = compile_batch(out, n, lib, err, errlen);
    for (int i = 0; st == KILN_OK && i < n; i++) st = finish(out[i], err, errlen);
    if (st == KILN_OK) return KILN_OK;
    for (int i = 0; i < n; i++) {
        rt_free(out[i]);
        out[i] = NULL;
    }
    jit_close(*lib);
    *lib = NULL;
    return st;
}

/* The library's kept copies of this program's weights (conv2d_const) go
 * with it: their addresses may next hold another program's weights. */
static void forget_weights(const RtProgram *p) {
    const LoopProgram *lp = p->plan ? p->plan->prog : NULL;
    for (int b = 0; lp && b < lp->nbufs; b++)
        if (lp->bufs[b]->body == BODY_WEIGHT && lp->bufs[b]->data)
            ext_kept_forget_all(lp->bufs[b]->data, (size_t)buf_bytes(lp->bufs[b]));
}

kiln_status rt_set_profile(RtProgram *p, bool on, bool trace) {
    prof_free(p->prof);
    p->prof = NULL;
    if (on && !(p->prof = prof_new(p->plan->sched, &p->code, trace))) return KILN_ERR_NOMEM;
    for (int b = 0; p->subs && b < 2 * p->nbufs; b++) /* a call's bodies too (no trace) */
        if (p->subs[b] && rt_set_profile(p->subs[b], on, false) != KILN_OK) return KILN_ERR_NOMEM;
    return KILN_OK;
}

void rt_reset_profile(RtProgram *p) {
    if (p->prof) prof_reset(p->prof);
    for (int b = 0; p->subs && b < 2 * p->nbufs; b++)
        if (p->subs[b]) rt_reset_profile(p->subs[b]);
}

void rt_print_profile(const RtProgram *p, FILE *f, const char *path) {
    if (!p->prof) return;
    prof_print(p->prof, f);
    const LoopProgram *lp = p->plan->prog;
    for (int b = 0; p->subs && b < 2 * p->nbufs; b++) {
        const RtProgram *sub = p->subs[b];
        if (!sub || !sub->prof) continue;
        const GraphCall *c = lp->bufs[b / 2]->call;
        char name[1024];
        graph_call_name(name, sizeof name, path, c, b % 2);
        fprintf(f, "\n== sub-program: %s (one run: %s)\n", name,
                c->kind == CALL_IF ? "a call that takes it" : "one iteration");
        rt_print_profile(sub, f, name);
    }
}

RtProf *rt_profile(const RtProgram *p) { return p->prof; }

void rt_free(RtProgram *p) {
    if (!p) return;
    prof_free(p->prof);
    forget_weights(p);
    for (int b = 0; p->subs && b < 2 * p->nbufs; b++) rt_free(p->subs[b]);
    kfree(p->subs);
    jit_close(p->lib);
    cg_free(&p->code);
    plan_free(p->plan);
    kfree(p->offset);
    for (RtRun *r = p->free_runs, *next; r; r = next) {
        next = r->next;
        run_free(r);
    }
    pthread_mutex_destroy(&p->runs_lock);
    kfree(p->direct);
    kfree(p);
}

/* ===== running ======================================================================= */

static void bind_buffers(const RtProgram *p, RtRun *r, const float *const *inputs,
                         float **outputs) {
    const LoopProgram *lp = p->plan->prog;
    for (int b = 0; b < p->nbufs; b++) {
        const Buffer *B = lp->bufs[b];
        r->bufs[b] = B->body == BODY_WEIGHT ? (float *)B->data
                     : p->offset[b] >= 0    ? (float *)(r->arena + p->offset[b])
                                            : NULL;
    }
    for (int i = 0; i < lp->ninputs; i++) r->bufs[lp->inputs[i]] = (float *)inputs[i];
    for (int i = 0; i < lp->noutputs; i++)
        if (p->direct[i]) r->bufs[lp->outputs[i]] = outputs[i];
}

/* Outputs that are inputs, weights, or a second name for another output. */
static void copy_outputs(const RtProgram *p, const RtRun *r, float **outputs) {
    const LoopProgram *lp = p->plan->prog;
    for (int i = 0; i < lp->noutputs; i++) {
        if (p->direct[i]) continue;
        const Buffer *b = lp->bufs[lp->outputs[i]];
        if (b->numel > 0 && r->bufs[b->id])
            memcpy(outputs[i], r->bufs[b->id], (size_t)buf_bytes(b));
    }
}

kiln_status rt_run(RtProgram *p, const float *const *inputs, float **outputs, char *err,
                   size_t errlen) {
    if (errlen) err[0] = 0;
    RtRun *run = run_take(p);
    if (!run) {
        util_fmt(err, errlen, "out of memory: %lld bytes of arena for a concurrent run",
                 (long long)p->stats.arena_bytes);
        return KILN_ERR_NOMEM;
    }
    bind_buffers(p, run, inputs, outputs);
    KilnRT rt = rt_externs;
#ifdef KILN_TESTING
    if (rt_test_set) rt = rt_test_table;
#endif
    rt.call = rt_call;
    rt.prog = p;
    rt.err = err; /* a gather's index out of range is reported here */
    rt.errlen = errlen;
    unsigned prev = ext_isa_enter(p->plan->sched->cfg.target.ext);
    pthread_mutex_lock(&p->runs_lock);
    int level = rt_team_pick(&p->team);
    pthread_mutex_unlock(&p->runs_lock);
    int want = rt_team_size(&p->team, level), team = omp_get_max_threads();
    if (want > 0 && want != team) omp_set_num_threads(want);
    if (p->prof) rt.prof = prof_run_begin(p->prof);
    double t0 = util_now_ms();
    int rc = p->entry ? p->entry(run->bufs, &rt) : 0;
    double ms = util_now_ms() - t0;
    if (p->prof) prof_run_end(p->prof);
    if (want > 0 && want != team) omp_set_num_threads(team);
    ext_isa_leave(prev);
    pthread_mutex_lock(&p->runs_lock);
    bool epoch = rt_team_record(&p->team, level, rc == 0 ? ms : -1);
    bool log = epoch && (p->plan->sched->cfg.logs & LOG_TEAM);
    RtTeam seen;
    if (log) seen = p->team; /* for the log line, outside the lock */
    pthread_mutex_unlock(&p->runs_lock);
    if (log)
        loop_log(&p->plan->sched->cfg, LOG_TEAM,
                 "team: %d thread%s: %.4f ms per run over %d runs; next %d thread%s (%s)\n",
                 seen.size[level], seen.size[level] == 1 ? "" : "s", seen.est[level],
                 seen.done_count, seen.size[seen.cur], seen.size[seen.cur] == 1 ? "" : "s",
                 seen.why);
    kiln_status st = KILN_OK;
    if (rc == KILN_RT_ERR_INPUT)
        st = KILN_ERR_INPUT;
    else if (rc != 0) {
        util_fmt(err, errlen, "out of memory in a kernel or an extern kernel");
        st = KILN_ERR_NOMEM;
    } else
        copy_outputs(p, run, outputs);
    run_give(p, run);
    return st;
}

void rt_set_program_threads(RtProgram *p, int n, bool fixed) {
    p->threads = n > 0 ? n : 0;
    pthread_mutex_lock(&p->runs_lock);
    rt_team_init(&p->team, p->threads, fixed);
    pthread_mutex_unlock(&p->runs_lock);
}

RtTeam rt_team(RtProgram *p) {
    pthread_mutex_lock(&p->runs_lock);
    RtTeam t = p->team;
    pthread_mutex_unlock(&p->runs_lock);
    return t;
}

int rt_runs(RtProgram *p) {
    pthread_mutex_lock(&p->runs_lock);
    int n = p->nruns;
    pthread_mutex_unlock(&p->runs_lock);
    return n;
}

const char *rt_source(const RtProgram *p) { return p->code.source; }
const CgOutput *rt_code(const RtProgram *p) { return &p->code; }
const RtStats *rt_stats(const RtProgram *p) { return &p->stats; }
const Schedule *rt_schedule(const RtProgram *p) { return p->plan->sched; }
const Graph *rt_graph(const RtProgram *p) { return p->plan->dec; }
int64_t rt_buffer_offset(const RtProgram *p, int b) {
    return b >= 0 && b < p->nbufs ? p->offset[b] : -1;
}

/* ===== the public API ================================================================== */

/* At most this many shapes per program besides its first (kiln.h). */
enum { RT_MAX_SHAPES = 64 };

struct kiln_program {
    RtProgram *rt;
    int threads; /* resolved at compile time */
    /* An ONNX model with symbolic dims (kiln_graph.model): its bytes, and
     * the programs compiled for other input shapes on first use */
    unsigned char *model;
    size_t model_len;
    char *model_name;
    kiln_options opts;
    char target[32]; /* opts.target's text */
    pthread_mutex_t shapes_lock;
    kiln_program **shapes;
    int nshapes;
    bool env_profile; /* KILN_PROFILE=1: the profile goes to stderr when freed */
    char *trace;      /* KILN_TRACE=FILE: the trace is written there when freed */
};

/* The message of the calling thread's last run of a program: a run's error
 * reaches only the thread that made the call, whatever others run. */
static _Thread_local struct {
    const kiln_program *p;
    char err[1024];
} last_run;

/* The calling thread's message buffer for a run of p, cleared. */
static char *run_err(const kiln_program *p) {
    last_run.p = p;
    last_run.err[0] = 0;
    return last_run.err;
}

kiln_options kiln_default_options(void) {
    kiln_options o = {0, 1, 1, NULL, 0};
    return o;
}

kiln_status kiln_compile(kiln_graph *g, int threads, kiln_program **out) {
    kiln_options o = kiln_default_options();
    o.threads = threads;
    return kiln_compile_with(g, &o, out);
}

/* Unfused: every value materialized (no inlining) and no fusion rounds, so
 * each op is its own kernel: the eager baseline, with the same codegen.
 * extern_epilogue 0: externs are walls, as in Inductor. */
KilnConfig rt_config(const kiln_options *o) {
    KilnConfig cfg = kiln_config_default();
    char err[256];
    Target t; /* a bad name keeps the default; kiln_compile_with reports it */
    if (o->target && *o->target && tgt_resolve(o->target, &t, err, sizeof err) == KILN_OK)
        cfg.target = t;
    cfg.extern_epilogue = o->extern_epilogue != 0;
    if (!o->fuse) {
        cfg.max_inline_users = 0;
        cfg.max_rounds = 0;
    }
    return cfg;
}

/* Can a file be made at path: its folder exists and takes new files, and
 * path names no folder? (KILN_TRACE's file is written when the program is
 * freed, too late to fail; this catches a wrong path before anything runs.) */
static bool can_create(const char *path, char *err, size_t errlen) {
    struct stat sb;
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 0;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        errno = EISDIR;
    } else if (n >= sizeof dir) {
        errno = ENAMETOOLONG;
    } else {
        if (!slash)
            strcpy(dir, ".");
        else if (n == 0)
            strcpy(dir, "/");
        else
            memcpy(dir, path, n), dir[n] = 0;
        if (access(dir, W_OK | X_OK) == 0) return true;
    }
    util_fmt(err, errlen, "KILN_TRACE: cannot write %s: %s", path, strerror(errno));
    return false;
}

kiln_status rt_env_profile(bool *on, const char **trace, char *err, size_t errlen) {
    const char *v = getenv("KILN_PROFILE");
    *trace = getenv("KILN_TRACE");
    if (*trace && !**trace) *trace = NULL;
    *on = *trace != NULL;
    if (*trace && !can_create(*trace, err, errlen)) return KILN_ERR_ENV;
    if (!v || !*v || !strcmp(v, "0")) return KILN_OK;
    if (!strcmp(v, "1")) return *on = true, KILN_OK;
    util_fmt(err, errlen, "KILN_PROFILE=%s: expected 1 (profile every run) or 0", v);
    return KILN_ERR_INPUT;
}

/* Start p's profiler as the environment asked (rt_env_profile's on and
 * trace, read before p was compiled). */
static kiln_status start_env_profile(kiln_program *p, bool on, const char *trace, char *err,
                                     size_t errlen) {
    kiln_status st = KILN_OK;
    p->env_profile = on;
    if (!on) return st;
    if (trace && !(p->trace = kmalloc(strlen(trace) + 1))) st = KILN_ERR_NOMEM;
    if (trace && p->trace) strcpy(p->trace, trace);
    if (st == KILN_OK) st = rt_set_profile(p->rt, true, trace != NULL);
    if (st == KILN_ERR_NOMEM) util_fmt(err, errlen, "out of memory for the profiler");
    return st;
}

static void trace_fn(FILE *f, void *pr) { prof_trace(pr, f); }

/* The profile KILN_PROFILE asked for, on stderr, and KILN_TRACE's file
 * (written under a temporary name and renamed, so a failure leaves none). */
static void end_env_profile(kiln_program *p) {
    const RtProf *pr = rt_profile(p->rt);
    if (!p->env_profile || !pr) return;
    fprintf(stderr, "kiln: KILN_PROFILE: %s\n", p->model_name ? p->model_name : "the program");
    rt_print_profile(p->rt, stderr, "");
    if (p->trace && !util_write_file(p->trace, trace_fn, (void *)pr))
        fprintf(stderr, "kiln: KILN_TRACE: cannot write %s: %s\n", p->trace, strerror(errno));
}

kiln_status kiln_compile_with(kiln_graph *g, const kiln_options *opt, kiln_program **out) {
    kiln_options o = opt ? *opt : kiln_default_options();
    int threads = o.threads;
    *out = NULL;
    if (g->status != KILN_OK) return g->status;
    KilnConfig cfg = rt_config(&o);
    kiln_status st = tgt_resolve(o.target, &cfg.target, g->err, sizeof g->err);
    bool env_on;
    const char *env_trace;
    if (st == KILN_OK) st = rt_env_profile(&env_on, &env_trace, g->err, sizeof g->err);
    if (st != KILN_OK) return st; /* before anything compiles */
    kiln_program *p = kcalloc(1, sizeof *p);
    if (!p) {
        util_fmt(g->err, sizeof g->err, "out of memory");
        return KILN_ERR_NOMEM;
    }
    unsigned prev = ext_isa_enter(cfg.target.ext); /* BLAS's first init sees the tier */
    ext_blas_init();
    p->threads = rt_resolve_threads(threads);
    /* the message, but not a sticky failure: the graph stays usable */
    st = rt_compile(g, &cfg, &p->rt, g->err, sizeof g->err);
    ext_isa_leave(prev);
    if (st != KILN_OK) {
        kfree(p);
        return st;
    }
    rt_set_program_threads(p->rt, p->threads, o.fixed_threads != 0);
    pthread_mutex_init(&p->shapes_lock, NULL);
    if ((st = start_env_profile(p, env_on, env_trace, g->err, sizeof g->err)) != KILN_OK) {
        kiln_program_free(p);
        return st;
    }
    if (g->model && (!o.target || strlen(o.target) < sizeof p->target) &&
        (p->model = kmalloc(g->model_len ? g->model_len : 1)) &&
        (p->model_name = kmalloc(strlen(g->model_name) + 1))) {
        memcpy(p->model, g->model, g->model_len);
        strcpy(p->model_name, g->model_name);
        p->model_len = g->model_len;
        p->opts = o;
        if (o.target) p->opts.target = strcpy(p->target, o.target);
    } else if (g->model) { /* no memory for the copy: this shape only */
        kfree(p->model);
        p->model = NULL;
    }
    *out = p;
    return KILN_OK;
}

static kiln_status prog_fail(kiln_program *p, kiln_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static kiln_status prog_fail(kiln_program *p, kiln_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (last_run.p == p) vsnprintf(last_run.err, sizeof last_run.err, fmt, ap);
    va_end(ap);
    return st;
}

/* Whether inputs have the shapes p was compiled for. */
static bool same_shapes(const kiln_program *p, const kiln_tensor *inputs) {
    const Graph *g = rt_graph(p->rt);
    for (int i = 0; i < kiln_num_inputs(g); i++) {
        kiln_tensor d = kiln_input_desc(g, i);
        if (d.rank != inputs[i].rank) return false;
        for (int k = 0; k < d.rank; k++)
            if (d.shape[k] != inputs[i].shape[k]) return false;
    }
    return true;
}

static kiln_program *known_shape(kiln_program *p, const kiln_tensor *inputs) {
    for (int k = 0; k < p->nshapes; k++)
        if (same_shapes(p->shapes[k], inputs)) return p->shapes[k];
    return NULL;
}

/* The program for inputs' shapes: p itself, or for a model with symbolic
 * dims one compiled for them on first use and kept (the model imported
 * again with these shapes, so its declared dims are checked as at
 * import; the JIT cache makes a shape compiled before in any process
 * cheap). On failure p's run error says why. */
static kiln_status for_shapes(kiln_program *p, const kiln_tensor *inputs, kiln_program **out) {
    *out = p;
    if (!p->model || same_shapes(p, inputs)) return KILN_OK;
    pthread_mutex_lock(&p->shapes_lock);
    kiln_program *v = known_shape(p, inputs);
    int have = p->nshapes;
    pthread_mutex_unlock(&p->shapes_lock);
    if ((*out = v)) return KILN_OK;
    if (have >= RT_MAX_SHAPES)
        return prog_fail(p, KILN_ERR_INPUT,
                         "inputs of a new shape: the program already holds %d shapes (at most)",
                         RT_MAX_SHAPES + 1);
    const Graph *g0 = rt_graph(p->rt);
    int n = kiln_num_inputs(g0);
    kiln_onnx_input *sh = kcalloc((size_t)n + 1, sizeof *sh);
    kiln_graph *g = kiln_graph_new();
    if (!sh || !g) {
        kfree(sh), kiln_graph_free(g);
        return prog_fail(p, KILN_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++) {
        sh[i].name = kiln_input_name(g0, i);
        sh[i].rank = inputs[i].rank;
        memcpy(sh[i].shape, inputs[i].shape, sizeof sh[i].shape);
    }
    kiln_status st = kiln_onnx_import_buffer(g, p->model, p->model_len, p->model_name, n, sh, NULL);
    kfree(g->model); /* the first program keeps the model */
    g->model = NULL;
    if (st == KILN_OK) st = kiln_compile_with(g, &p->opts, &v);
    kfree(sh);
    if (st != KILN_OK) {
        prog_fail(p, st, "inputs of a new shape: %s", kiln_error(g));
        kiln_graph_free(g);
        return st;
    }
    kiln_graph_free(g);
    kfree(v->trace); /* the first shape's program writes KILN_TRACE's file */
    v->trace = NULL;
    pthread_mutex_lock(&p->shapes_lock);
    kiln_program *had = known_shape(p, inputs); /* another thread made it first */
    if (!had && p->nshapes < RT_MAX_SHAPES) {
        kiln_program **grown = krealloc(p->shapes, sizeof *grown * (size_t)(p->nshapes + 1));
        if (grown) p->shapes = grown, p->shapes[p->nshapes++] = v, had = v;
    }
    pthread_mutex_unlock(&p->shapes_lock);
    if (had != v) kiln_program_free(v);
    if (!(*out = had)) return prog_fail(p, KILN_ERR_NOMEM, "out of memory");
    return KILN_OK;
}

/* A run of p on another shape's program v: its error becomes p's. */
static kiln_status as_p(kiln_program *p, const kiln_program *v, kiln_status st) {
    if (st != KILN_OK && last_run.p == v) last_run.p = p;
    return st;
}

int kiln_program_shapes(const kiln_program *p) {
    pthread_mutex_lock((pthread_mutex_t *)&p->shapes_lock);
    int n = 1 + p->nshapes;
    pthread_mutex_unlock((pthread_mutex_t *)&p->shapes_lock);
    return n;
}

kiln_status kiln_program_outputs_for(kiln_program *p, const kiln_tensor *inputs,
                                     kiln_tensor *descs) {
    run_err(p);
    kiln_program *v;
    kiln_status st = for_shapes(p, inputs, &v);
    if (st != KILN_OK) return st;
    const Graph *g = rt_graph(v->rt);
    for (int i = 0; i < kiln_num_outputs(g); i++) descs[i] = kiln_output_desc(g, i);
    return KILN_OK;
}

static kiln_status check_input(kiln_program *p, int i, const kiln_tensor *t) {
    return graph_check_input(rt_graph(p->rt), i, t, last_run.err, sizeof last_run.err);
}

/* The float views of a run's inputs and outputs, and what was allocated. */
typedef struct {
    int nin, nout;
    const float **in;
    float **out;
    bool *in_owned, *out_owned;
} Io;

static void io_free(Io *io) {
    for (int i = 0; io->in && io->in_owned && i < io->nin; i++)
        if (io->in_owned[i]) kfree((void *)io->in[i]);
    for (int i = 0; io->out && io->out_owned && i < io->nout; i++)
        if (io->out_owned[i]) kfree(io->out[i]);
    kfree(io->in), kfree(io->out), kfree(io->in_owned), kfree(io->out_owned);
}

static float *bool_to_float(const kiln_tensor *t) {
    int64_t n = kiln_tensor_numel(t);
    float *f = kmalloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    for (int64_t k = 0; f && k < n; k++) f[k] = ((const unsigned char *)t->data)[k] ? 1.0f : 0.0f;
    return f;
}

static kiln_status io_inputs(Io *io, const kiln_tensor *inputs) {
    for (int i = 0; i < io->nin; i++) {
        if (inputs[i].dtype == KILN_F32 || inputs[i].dtype == KILN_F64) { /* as stored */
            io->in[i] = inputs[i].data;
            continue;
        }
        io->in_owned[i] = true;
        if (!(io->in[i] = bool_to_float(&inputs[i]))) return KILN_ERR_NOMEM;
    }
    return KILN_OK;
}

/* caller: the outputs' memory is the caller's (kiln_program_run_into) */
static kiln_status io_outputs(Io *io, const Graph *g, kiln_tensor *outputs, bool caller) {
    for (int i = 0; i < io->nout; i++) {
        if (!caller) outputs[i] = kiln_output_desc(g, i);
        if (!caller && kiln_tensor_alloc(&outputs[i]) != KILN_OK) return KILN_ERR_NOMEM;
        if (outputs[i].dtype == KILN_F32 || outputs[i].dtype == KILN_F64) {
            io->out[i] = outputs[i].data;
            continue;
        }
        int64_t n = kiln_tensor_numel(&outputs[i]);
        io->out_owned[i] = true;
        if (!(io->out[i] = kmalloc(sizeof(float) * (size_t)(n > 0 ? n : 1)))) return KILN_ERR_NOMEM;
    }
    return KILN_OK;
}

static void io_convert_outputs(Io *io, kiln_tensor *outputs) {
    for (int i = 0; i < io->nout; i++) {
        if (!io->out_owned[i]) continue;
        int64_t n = kiln_tensor_numel(&outputs[i]);
        for (int64_t k = 0; k < n; k++)
            ((unsigned char *)outputs[i].data)[k] = io->out[i][k] != 0.0f;
    }
}

static kiln_status io_alloc(Io *io) {
    io->in = kcalloc((size_t)io->nin + 1, sizeof(float *));
    io->out = kcalloc((size_t)io->nout + 1, sizeof(float *));
    io->in_owned = kcalloc((size_t)io->nin + 1, sizeof(bool));
    io->out_owned = kcalloc((size_t)io->nout + 1, sizeof(bool));
    return io->in && io->out && io->in_owned && io->out_owned ? KILN_OK : KILN_ERR_NOMEM;
}

static kiln_status run_io(kiln_program *p, Io *io, const kiln_tensor *inputs, kiln_tensor *outputs,
                          bool caller) {
    const Graph *g = rt_graph(p->rt);
    kiln_status st = io_alloc(io);
    if (st == KILN_OK) st = io_inputs(io, inputs);
    if (st == KILN_OK) st = io_outputs(io, g, outputs, caller);
    if (st != KILN_OK) return prog_fail(p, st, "out of memory: inputs and outputs of a run");
    st = rt_run(p->rt, io->in, io->out, last_run.err, sizeof last_run.err);
    if (st == KILN_OK) io_convert_outputs(io, outputs);
    return st;
}

kiln_status kiln_program_run(kiln_program *p, const kiln_tensor *inputs, kiln_tensor *outputs) {
    if (p->model && !same_shapes(p, inputs)) {
        run_err(p);
        kiln_program *v;
        kiln_status st = for_shapes(p, inputs, &v);
        return st != KILN_OK ? st : as_p(p, v, kiln_program_run(v, inputs, outputs));
    }
    const Graph *g = rt_graph(p->rt);
    Io io = {.nin = kiln_num_inputs(g), .nout = kiln_num_outputs(g)};
    run_err(p);
    for (int i = 0; i < io.nin; i++)
        if (check_input(p, i, &inputs[i]) != KILN_OK) return KILN_ERR_INPUT;
    for (int i = 0; i < io.nout; i++) outputs[i] = (kiln_tensor){0};
    kiln_status st = run_io(p, &io, inputs, outputs, false);
    io_free(&io);
    if (st != KILN_OK)
        for (int i = 0; i < io.nout; i++) kiln_tensor_free(&outputs[i]);
    return st;
}

/* Output i must be exactly the declared dtype and shape, with memory. */
static kiln_status check_output(kiln_program *p, int i, const kiln_tensor *t) {
    const Graph *g = rt_graph(p->rt);
    kiln_tensor want = kiln_output_desc(g, i);
    bool same = want.dtype == t->dtype && want.rank == t->rank;
    for (int d = 0; same && d < t->rank; d++) same = want.shape[d] == t->shape[d];
    if (same && (t->data || kiln_tensor_numel(t) == 0)) return KILN_OK; /* empty: no memory */
    char a[160];
    graph_shape_str(a, sizeof a, want.rank, want.shape);
    return prog_fail(p, KILN_ERR_INPUT, "output '%s': expected memory for %s%s",
                     kiln_output_name(g, i), kiln_dtype_name(want.dtype), a);
}

kiln_status kiln_program_run_into(kiln_program *p, const kiln_tensor *inputs,
                                  kiln_tensor *outputs) {
    if (p->model && !same_shapes(p, inputs)) {
        run_err(p);
        kiln_program *v;
        kiln_status st = for_shapes(p, inputs, &v);
        return st != KILN_OK ? st : as_p(p, v, kiln_program_run_into(v, inputs, outputs));
    }
    const Graph *g = rt_graph(p->rt);
    Io io = {.nin = kiln_num_inputs(g), .nout = kiln_num_outputs(g)};
    run_err(p);
    for (int i = 0; i < io.nin; i++)
        if (check_input(p, i, &inputs[i]) != KILN_OK) return KILN_ERR_INPUT;
    for (int i = 0; i < io.nout; i++)
        if (check_output(p, i, &outputs[i]) != KILN_OK) return KILN_ERR_INPUT;
    kiln_status st = run_io(p, &io, inputs, outputs, true);
    io_free(&io);
    return st;
}

const char *kiln_program_error(const kiln_program *p) {
    return last_run.p == p ? last_run.err : "";
}
RtProgram *kiln_program_rt(kiln_program *p) { return p->rt; }
const char *kiln_program_source(const kiln_program *p) { return rt_source(p->rt); }
int kiln_program_threads(const kiln_program *p) { return p->threads; }

void kiln_program_free(kiln_program *p) {
    if (!p) return;
    end_env_profile(p);
    kfree(p->trace);
    for (int k = 0; k < p->nshapes; k++) kiln_program_free(p->shapes[k]);
    kfree(p->shapes);
    kfree(p->model);
    kfree(p->model_name);
    pthread_mutex_destroy(&p->shapes_lock);
    rt_free(p->rt);
    kfree(p);
}
