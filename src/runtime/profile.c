/*
 * profile.c -- where a run's time goes: every kernel and library call.
 *
 * The generated entry point calls KilnRT.prof's hook around each call
 * (KILN_PROF_BEGIN / KILN_PROF_END, on the thread that runs kiln_entry),
 * and each thread of a generated kernel's parallel region calls it around
 * its share of the loop (KILN_PROF_THREAD_BEGIN / _END). The same compiled
 * code runs with or without the profiler: off, each hook is one test of a
 * NULL pointer (per call) or one relaxed atomic load (per thread and
 * parallel kernel).
 *
 * Per call the profiler sums wall time and the threads' busy time; with a
 * trace it also keeps every span (a Chrome trace: one track per OpenMP
 * thread, the calls on the track of the thread that runs kiln_entry, each
 * thread's share of a parallel kernel nested on its own track). A library
 * call (OpenBLAS, oneDNN) runs on the library's own threads, which are
 * not instrumented: it shows as one span on the calling thread.
 *
 * What a call moved and computed comes from the schedule: the bytes its
 * kernel loads and stores (Kernel.load_bytes + store_bytes, the traffic
 * the scheduler counts) and, for matmul and conv, 2 flops per
 * multiply-add. A generated kernel's GFLOP/s is not given: its work is a
 * few operations per element and its bound is memory (GB/s says how
 * close).
 *
 * Runs are profiled one at a time (prof_run_begin takes a lock): a run's
 * call spans are kept per call, not per run.
 */
#include "runtime/runtime.h"
#include "externs/externs.h"
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { PROF_MAX_THREADS = 256, PROF_TRACE_EVENTS = 1 << 18 };

typedef struct {
    int call;
    int tid;        /* OpenMP thread number; the calls are on the entry thread's */
    bool thread;    /* a thread's share of a parallel kernel, not a call */
    int64_t t0, t1; /* ns since the profiler started */
} ProfEvent;

typedef RtProfCall ProfCall;

struct RtProf {
    KilnProf base; /* first: the hook's self */
    pthread_mutex_t lock;
    int ncalls;
    ProfCall *calls;
    int64_t start;          /* CLOCK_MONOTONIC ns when made */
    int64_t call_t0;        /* the current call's begin */
    int64_t run_t0, run_ns; /* the current run's begin; all runs' time */
    int64_t runs;
    int64_t tbegin[PROF_MAX_THREADS]; /* each thread's share begin */
    bool trace;
    ProfEvent *ev;
    atomic_int nev; /* events claimed (may pass the capacity) */
    int threads;    /* the largest team seen */
};

static void push(RtProf *p, int call, int tid, bool thread, int64_t t0, int64_t t1) {
    if (!p->trace) return;
    int i = atomic_fetch_add_explicit(&p->nev, 1, memory_order_relaxed);
    if (i < PROF_TRACE_EVENTS) p->ev[i] = (ProfEvent){call, tid, thread, t0, t1};
}

static void hook(KilnProf *self, int call, int event) {
    RtProf *p = (RtProf *)self;
    if (call < 0 || call >= p->ncalls) return;
    int64_t t = util_now_ns() - p->start;
    int tid = omp_get_thread_num();
    if (tid < 0 || tid >= PROF_MAX_THREADS) return;
    ProfCall *c = &p->calls[call];
    switch (event) {
    case KILN_PROF_BEGIN:
        ext_dnnl_impl_reset();
        p->call_t0 = t;
        break;
    case KILN_PROF_END: {
        const char *impl = c->impl[0] ? NULL : ext_dnnl_last_impl();
        if (impl) util_fmt(c->impl, sizeof c->impl, "%s", *impl ? impl : "declined");
        c->ns += t - p->call_t0;
        c->count++;
        push(p, call, tid, false, p->call_t0, t);
        break;
    }
    case KILN_PROF_THREAD_BEGIN: p->tbegin[tid] = t; break;
    case KILN_PROF_THREAD_END:
        __atomic_fetch_add(&c->busy_ns, t - p->tbegin[tid], __ATOMIC_RELAXED);
        if (tid + 1 > p->threads) p->threads = tid + 1; /* a benign race: a maximum */
        push(p, call, tid, true, p->tbegin[tid], t);
        break;
    default: break;
    }
}

static double ext_flops(const Buffer *b) {
    double n = (double)b->numel;
    const int64_t *ws = b->opnd[1].shape;
    switch (b->ext_op) {
    case OP_MATMUL: return 2.0 * n * (double)b->opnd[0].shape[b->opnd[0].rank - 1];
    case OP_CONV2D: return 2.0 * n * (double)(ws[1] * ws[2] * ws[3]);
    case OP_CONV_TRANSPOSE2D: {
        const int64_t *xs = b->opnd[0].shape;
        return 2.0 * (double)(xs[0] * xs[1] * xs[2] * xs[3]) * (double)(ws[1] * ws[2] * ws[3]);
    }
    default: return 0;
    }
}

RtProf *prof_new(const Schedule *s, const CgOutput *code, bool trace) {
    RtProf *p = kcalloc(1, sizeof *p);
    if (!p) return NULL;
    pthread_mutex_init(&p->lock, NULL);
    p->ncalls = code->ncalls;
    p->calls = kcalloc((size_t)(p->ncalls + 1), sizeof *p->calls);
    p->trace = trace;
    if (trace) p->ev = kmalloc(sizeof(ProfEvent) * PROF_TRACE_EVENTS);
    if (!p->calls || (trace && !p->ev)) {
        prof_free(p);
        return NULL;
    }
    p->base.hook = hook;
    p->start = util_now_ns();
    char buf[200];
    for (int i = 0; i < p->ncalls; i++) {
        const CgCall *cc = &code->calls[i];
        const Kernel *k = &s->kernels[cc->kernel];
        ProfCall *c = &p->calls[i];
        c->name = cc->name;
        c->kind = kernel_kind_name[k->kind];
        c->bytes = k->load_bytes + k->store_bytes;
        if (k->kind == KK_EXTERN) {
            const Buffer *b = s->prog->bufs[s->nodes[k->members[0]].buf];
            c->kind = op_info[b->ext_op].name;
            c->flops = ext_flops(b);
            const char *path = sched_extern_path(s->prog, b, buf, sizeof buf);
            util_fmt(c->path, sizeof c->path, "%s%s", path ? path : "kiln's gather loop",
                     k->n > 1 ? ", epilogue fused" : "");
        } else {
            util_fmt(c->path, sizeof c->path, "generated, %d loop nest%s, %s", k->loop_nests,
                     k->loop_nests == 1 ? "" : "s", cc->parallel ? "parallel" : "one thread");
        }
    }
    return p;
}

void prof_free(RtProf *p) {
    if (!p) return;
    pthread_mutex_destroy(&p->lock);
    kfree(p->ev);
    kfree(p->calls);
    kfree(p);
}

KilnProf *prof_run_begin(RtProf *p) {
    pthread_mutex_lock(&p->lock);
    p->run_t0 = util_now_ns();
    return &p->base;
}

void prof_run_end(RtProf *p) {
    p->run_ns += util_now_ns() - p->run_t0;
    p->runs++;
    pthread_mutex_unlock(&p->lock);
}

void prof_reset(RtProf *p) {
    pthread_mutex_lock(&p->lock);
    for (int i = 0; i < p->ncalls; i++)
        p->calls[i].ns = p->calls[i].busy_ns = p->calls[i].count = 0;
    p->run_ns = p->runs = 0;
    atomic_store(&p->nev, 0);
    pthread_mutex_unlock(&p->lock);
}

int64_t prof_runs(const RtProf *p) { return p->runs; }

const RtProfCall *prof_call(const RtProf *p, int call) {
    return call >= 0 && call < p->ncalls ? &p->calls[call] : NULL;
}

double prof_call_ms(const RtProf *p, int call) {
    return call >= 0 && call < p->ncalls && p->runs
               ? (double)p->calls[call].ns / 1e6 / (double)p->runs
               : 0;
}

double prof_run_ms(const RtProf *p) {
    return p->runs ? (double)p->run_ns / 1e6 / (double)p->runs : 0;
}

static int by_time(const void *a, const void *b, void *ctx) {
    const ProfCall *c = ctx;
    int64_t x = c[*(const int *)a].ns, y = c[*(const int *)b].ns;
    return x < y ? 1 : x > y ? -1 : *(const int *)a - *(const int *)b;
}

static void rate(FILE *f, double num, double ms, double scale) {
    if (num > 0 && ms > 0)
        fprintf(f, " %8.2f", num / scale / ms);
    else
        fprintf(f, " %8s", "-");
}

/* One row: calls, ms, share, MB, GB/s, GFLOP/s. */
static void row(FILE *f, int64_t n, double ms, double total, double bytes, double flops) {
    fprintf(f, " %5lld %9.4f %6.1f%% %9.3f", (long long)n, ms, total > 0 ? 100 * ms / total : 0,
            bytes / 1e6);
    rate(f, bytes, ms, 1e6);
    rate(f, flops, ms, 1e6);
}

void prof_print(const RtProf *p, FILE *f) {
    double runs = p->runs ? (double)p->runs : 1, run_ms = prof_run_ms(p), calls_ms = 0;
    for (int i = 0; i < p->ncalls; i++) calls_ms += (double)p->calls[i].ns / 1e6 / runs;
    fprintf(f,
            "== profile: %d call%s, %lld run%s; per run %.4f ms: calls %.4f ms, between calls "
            "%.4f ms\n",
            p->ncalls, p->ncalls == 1 ? "" : "s", (long long)p->runs, p->runs == 1 ? "" : "s",
            run_ms, calls_ms, run_ms - calls_ms);
    if (!p->runs) return;
    fprintf(f, "  (ms per run; share of the run; MB moved per run, from the schedule's traffic; "
               "threads: their busy time over the call's)\n");
    fprintf(f, "%5s  %-34s %-16s %5s %9s %7s %9s %8s %8s %7s  %s\n", "call", "kernel", "kind",
            "runs", "ms", "share", "MB", "GB/s", "GFLOP/s", "threads", "path");
    int *order = kmalloc(sizeof(int) * (size_t)(p->ncalls + 1));
    int n = order ? p->ncalls : 0;
    for (int i = 0; i < n; i++) order[i] = i;
    if (n) qsort_r(order, (size_t)n, sizeof *order, by_time, p->calls);
    for (int j = 0; j < n; j++) {
        const ProfCall *c = &p->calls[order[j]];
        double ms = (double)c->ns / 1e6 / runs;
        fprintf(f, "%5d  %-34.34s %-16.16s", order[j], c->name, c->kind);
        row(f, c->count / (int64_t)runs, ms, run_ms, (double)c->bytes, c->flops);
        if (c->busy_ns > 0 && c->ns > 0)
            fprintf(f, " %7.2f", (double)c->busy_ns / (double)c->ns);
        else
            fprintf(f, " %7s", "-");
        fprintf(f, "  %s", c->path);
        if (c->impl[0])
            fprintf(f,
                    !strncmp(c->impl, "OpenBLAS", 8) ? " [%s]"
                    : strcmp(c->impl, "declined")    ? " [oneDNN ran %s]"
                                                     : " [oneDNN %s it]",
                    c->impl);
        fprintf(f, "\n");
    }
    kfree(order);
    fprintf(f, "== by kind\n%-24s %5s %9s %7s %9s %8s %8s\n", "kind", "calls", "ms", "share", "MB",
            "GB/s", "GFLOP/s");
    for (int i = 0; i < p->ncalls; i++) {
        bool first = true;
        for (int j = 0; j < i && first; j++)
            first = strcmp(p->calls[j].kind, p->calls[i].kind) != 0;
        if (!first) continue;
        int64_t count = 0;
        double ms = 0, bytes = 0, flops = 0;
        for (int j = i; j < p->ncalls; j++) {
            if (strcmp(p->calls[j].kind, p->calls[i].kind)) continue;
            count++;
            ms += (double)p->calls[j].ns / 1e6 / runs;
            bytes += (double)p->calls[j].bytes;
            flops += p->calls[j].flops;
        }
        fprintf(f, "%-24s", p->calls[i].kind);
        row(f, count, ms, run_ms, bytes, flops);
        fputc('\n', f);
    }
    fprintf(f, "%-24s", "between calls");
    row(f, 0, run_ms - calls_ms, run_ms, 0, 0);
    fputc('\n', f);
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", *s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

void prof_trace(const RtProf *p, FILE *f) {
    int n = atomic_load(&((RtProf *)p)->nev);
    int kept = n < PROF_TRACE_EVENTS ? n : PROF_TRACE_EVENTS;
    fprintf(f,
            "{\"displayTimeUnit\": \"ns\", \"otherData\": {\"runs\": %lld, \"events\": %d, "
            "\"dropped\": %d},\n \"traceEvents\": [\n",
            (long long)p->runs, kept, n - kept);
    fprintf(f, "  {\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 1, \"args\": {\"name\": "
               "\"kiln\"}}");
    int threads = p->threads > 0 ? p->threads : 1;
    for (int t = 0; t < threads; t++)
        fprintf(
            f,
            ",\n  {\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": %d, \"args\": "
            "{\"name\": \"OpenMP thread %d%s\"}}",
            t, t, t == 0 ? " (runs kiln_entry)" : "");
    for (int i = 0; p->trace && i < kept; i++) {
        const ProfEvent *e = &p->ev[i];
        const ProfCall *c = &p->calls[e->call];
        fprintf(f, ",\n  {\"name\": ");
        json_str(f, c->name);
        fprintf(f,
                ", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": 1, \"tid\": %d, \"ts\": %.3f, "
                "\"dur\": %.3f, \"args\": {\"call\": %d, \"kind\": ",
                e->thread ? "thread" : "call", e->tid, (double)e->t0 / 1e3,
                (double)(e->t1 - e->t0) / 1e3, e->call);
        json_str(f, c->kind);
        fprintf(f, ", \"bytes\": %lld, \"path\": ", (long long)c->bytes);
        json_str(f, c->path);
        fprintf(f, ", \"impl\": ");
        json_str(f, c->impl);
        fprintf(f, "}}");
    }
    fprintf(f, "\n]}\n");
}
