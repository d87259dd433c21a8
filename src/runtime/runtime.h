/*
 * runtime.h -- the top of the pipeline, below only the CLI.
 *
 *   plan.c     the pipeline driver: decompose -> lower -> schedule (Plan)
 *   runtime.c  Plan -> codegen -> JIT -> memory plan -> a program that runs;
 *              threads, the public kiln_compile / kiln_program_* API
 *   jit.c      the C compiler as a JIT, with a content-addressed cache
 *   team.c     how many threads each run uses, by measurement
 */
#ifndef KILN_RUNTIME_H
#define KILN_RUNTIME_H

#include "codegen/codegen.h"
#include "ref/ref.h"
#include <stdio.h>

/* ===== plan.c ============================================================ */

/* The compile pipeline up to scheduling, owned as one object. */
typedef struct {
    Graph *dec; /* the decomposed graph (owned) */
    LoopProgram *prog;
    Schedule *sched;
} Plan;
kiln_status plan_build(const Graph *g, const KilnConfig *cfg, Plan **out, char *err, size_t errlen);
void plan_free(Plan *p);

/* ===== team.c ============================================================ */

/* The team size of a program's runs, chosen by measuring run times (see
 * team.c). Not thread-safe: the runtime calls it under the program's lock. */
enum { RT_TEAM_LEVELS = 4 };
#define RT_TEAM_EPOCH_MS 20.0      /* run time an epoch measures one level for */
#define RT_TEAM_FIRST_MS 2.0       /* a level's first epoch */
#define RT_TEAM_PROBE_MS 5.0       /* an epoch of a level that is not the fastest */
#define RT_TEAM_SETTLE 3           /* runs not measured after a change of team size */
#define RT_TEAM_EXPLORE 100.0      /* measuring again costs at most 1/this of run time */
#define RT_TEAM_EXPLORE_FIRST 12.5 /* a level's first wait: RT_TEAM_EXPLORE / 8 */
typedef struct {
    int nlevels;                  /* 1: fixed */
    int size[RT_TEAM_LEVELS];     /* threads at each level; [0] the program's count */
    double est[RT_TEAM_LEVELS];   /* mean ms per run in its last epoch; < 0: not yet */
    double last[RT_TEAM_LEVELS];  /* the clock when its last epoch ended */
    double wait[RT_TEAM_LEVELS];  /* times its extra cost before it is measured again */
    double cost[RT_TEAM_LEVELS];  /* its last epoch's time beyond the fastest's, ms */
    int64_t runs[RT_TEAM_LEVELS]; /* runs made at each level */
    int cur;                      /* the level of the epoch in progress */
    int ecount;                   /* runs measured in it */
    double esum;                  /* their time, ms */
    double recent;                /* their moving average (weight 1/4), ms */
    int slow;                     /* the last runs in a row that were slow */
    bool probe;                   /* cur is not the fastest level */
    int settle;                   /* runs of this epoch still to let pass unmeasured */
    double settle_ms;             /* their time */
    bool settle_first;            /* one of them was a level's first run ever */
    double switch_ms;             /* what a change of team size costs, ms */
    double all_ms;                /* this epoch's runs, settling ones too: time */
    int64_t all_runs;             /* and count */
    double clock;                 /* run time summed over every run, ms */
    int done_count;               /* runs the last epoch measured */
    const char *why;              /* why cur was chosen */
} RtTeam;
/* threads <= 0: one level of 0 (the caller's team as it is). */
void rt_team_init(RtTeam *t, int threads, bool fixed);
/* The level for a run starting now. */
int rt_team_pick(const RtTeam *t);
/* A run at `level` took ms (< 0: not timed, only counted). True when it
 * ended an epoch: est[level] is its mean, cur the next epoch's level. */
bool rt_team_record(RtTeam *t, int level, double ms);
int rt_team_size(const RtTeam *t, int level);

/* ===== jit.c ============================================================== */
/*
 * jit.h -- compile generated C into a shared object and load it (internal).
 *
 * jit_compile writes the source into a cache directory under a name derived
 * from a hash of everything that decides the binary (source, flags, compiler
 * command and version, CPU), runs the system C compiler once per new key
 * and dlopens the result. A later compile of the same source, in this
 * process or another, loads the cached object without running the compiler.
 *
 *   $CC (default "cc", may hold words: "ccache gcc")
 *       -O3 -fopenmp -fno-math-errno -shared -fPIC -std=c11
 *       <extra_flags> -o <dir>/<key>.so.tmp.<pid>.<n> <dir>/<key>.c -lm
 *
 * The runtime's extra flags hold the target tier's (target.h: -march=
 * x86-64-v3 -mtune=native, ...); without them the object is baseline
 * x86-64.
 *
 * -fno-math-errno lets GCC inline and vectorize sqrtf (kernels never read
 * errno); everything else that must vectorize comes from vecmath.h. No
 * -lmvec: GCC calls libmvec only under -ffast-math, which kiln avoids.
 *   cache dir: $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else
 *              $HOME/.cache/kiln (created with parents, mode 0755)
 *
 * Entries appear only by rename(), so a reader never sees a partial file and
 * concurrent compilers of one key all succeed (the last rename wins, with
 * identical content). An entry that does not load (bad ELF magic, dlopen
 * fails, or the marker symbol kiln_jit_marker_<key> is missing) is deleted
 * and rebuilt once.
 */
typedef struct JitLib JitLib; /* a loaded shared object */

typedef struct {
    int cache_hit;      /* 1: loaded from the cache, no compiler ran */
    double compile_ms;  /* wall time of the compiler run; 0 on a hit */
    int units;          /* translation units compiled (2: in parallel, jit.c); 0 on a hit */
    char path[512];     /* the loaded .so */
    char src_path[512]; /* the cached source, kept for error reports */
} JitStats;

/* Compile (or find in the cache) and load source. extra_flags (NULL or "")
 * are appended to the standard flags, split at spaces. On failure returns
 * KILN_ERR_ENV (no compiler, compile error with the compiler's stderr and
 * the kept source path, cache directory unusable, dlopen failed) or
 * KILN_ERR_NOMEM, with a message in err. stats may be NULL. */
kiln_status jit_compile(const char *source, const char *extra_flags, JitLib **out, char *err,
                        size_t errlen, JitStats *stats);
/* The address of an exported symbol, or NULL. */
void *jit_sym(JitLib *lib, const char *name);
/* Unload (dlclose) and free; NULL is fine. Symbols must not be used after. */
void jit_close(JitLib *lib);

/* ===== runtime.c =========================================================== */

typedef struct RtProgram RtProgram;

/* Where the time of a compile went and what memory a run needs. */
typedef struct {
    double plan_ms; /* decompose + lower + schedule */
    double codegen_ms;
    double compile_ms;          /* the C compiler; 0 on a JIT cache hit */
    double load_ms;             /* JIT total: cache lookup, compiler, dlopen */
    int cache_hit;              /* 1: no compiler ran */
    int jit_units;              /* translation units compiled (JitStats.units) */
    int ncalls;                 /* kernels + extern calls */
    int64_t arena_bytes;        /* one block holding every intermediate buffer */
    int64_t io_bytes;           /* inputs + outputs (the caller's memory) */
    int64_t peak_bytes;         /* io_bytes + arena_bytes; weights are not counted */
    int64_t intermediate_bytes; /* the intermediates' sizes summed (no reuse) */
    const char *target;         /* the tier the kernels were compiled for: "v3" */
    char jit_flags[256];        /* the flags beyond the JIT's own: CG_EXTRA_FLAGS, the tier's */
} RtStats;

/* Decompose, lower, schedule, generate, JIT-compile and plan memory. */
kiln_status rt_compile(const Graph *g, const KilnConfig *cfg, RtProgram **out, char *err,
                       size_t errlen);
/* Compile n graphs with one compiler run (tests: many small programs).
 * out[i] receives program i; they share the loaded object *lib, which the
 * caller closes (jit_close) after freeing the programs. */
kiln_status rt_compile_many(const Graph *const *gs, int n, const KilnConfig *cfg, RtProgram **out,
                            JitLib **lib, char *err, size_t errlen);
/* Run: inputs[i] is input i as numel floats (bools 0/1), outputs[i] a dense
 * float array of output i's numel; none may alias another. Any number of
 * threads may run one program at once (each run takes an arena from the
 * program's pool). */
kiln_status rt_run(RtProgram *p, const float *const *inputs, float **outputs, char *err,
                   size_t errlen);
void rt_free(RtProgram *p);

/* ===== profile.c: where a run's time goes ================================ */

typedef struct RtProf RtProf;
typedef struct {
    const char *name; /* the kernel's function, or extern_kernels.conv2d ... */
    const char *kind; /* pointwise, reduction, or the extern's op */
    char path[256];   /* what runs it */
    int64_t bytes;    /* loaded + stored per call (the schedule's traffic) */
    double flops;     /* per call, matmul and conv; 0: not counted */
    int64_t ns;       /* wall time summed over the runs */
    int64_t busy_ns;  /* the threads' shares of a parallel kernel, summed */
    int64_t count;    /* calls made */
    char impl[32];    /* a oneDNN call: the implementation it ran on its first
                       * profiled run ("jit:avx2"; "declined" when oneDNN declined
                       * it and kiln's own loops ran), else "" */
} RtProfCall;
/* A profiler for the calls of a schedule's generated code; trace: keep
 * every span for prof_trace. NULL when out of memory. */
RtProf *prof_new(const Schedule *s, const CgOutput *code, bool trace);
void prof_free(RtProf *p);
/* Around one run (runs are profiled one at a time): the hook for KilnRT. */
KilnProf *prof_run_begin(RtProf *p);
void prof_run_end(RtProf *p);
void prof_reset(RtProf *p); /* forget the runs so far */
int64_t prof_runs(const RtProf *p);
const RtProfCall *prof_call(const RtProf *p, int call); /* NULL past the last */
double prof_run_ms(const RtProf *p);                    /* mean per run */
double prof_call_ms(const RtProf *p, int call);         /* mean per run */
/* Every call, slowest first, and a summary by kind. */
void prof_print(const RtProf *p, FILE *f);
/* The spans as a Chrome trace (JSON; Perfetto and chrome://tracing open it). */
void prof_trace(const RtProf *p, FILE *f);
/* Profile p's runs from now on (trace: keep the spans too), or stop
 * (on false; the profile so far is freed). Not while a run of p is in
 * flight. KILN_ERR_NOMEM when out of memory. */
kiln_status rt_set_profile(RtProgram *p, bool on, bool trace);
RtProf *rt_profile(const RtProgram *p); /* NULL when not profiling */
/* p's profile (prof_print), then each sub-program's of its calls (control
 * flow), named by path (the calls that lead there; "" at the top). */
void rt_print_profile(const RtProgram *p, FILE *f, const char *path);
void rt_reset_profile(RtProgram *p); /* prof_reset, sub-programs too */
/* What the environment asks of kiln_compile_with: KILN_PROFILE (unset,
 * empty or 0: off; 1: on; else KILN_ERR_INPUT, err says why) and
 * KILN_TRACE (a file: profile, and write the spans there when the program
 * is freed; *trace NULL when unset; KILN_ERR_ENV when no file can be made
 * there: its folder missing or not writable, or the name a folder's). */
kiln_status rt_env_profile(bool *on, const char **trace, char *err, size_t errlen);

const char *rt_source(const RtProgram *p);
/* The generated code and its calls (tests, reports). */
const CgOutput *rt_code(const RtProgram *p);
const RtStats *rt_stats(const RtProgram *p);
const Schedule *rt_schedule(const RtProgram *p);
/* The decomposed graph the program runs (inputs, outputs, their types). */
const Graph *rt_graph(const RtProgram *p);
/* A thread count: n > 0 as it is; n <= 0 means $KILN_NUM_THREADS (a bad
 * value warns once on stderr), else every core. */
int rt_resolve_threads(int n);
/* The calling thread's OpenMP team, and OpenBLAS's count, to
 * rt_resolve_threads(n) (tests, benchmarks: runs of rt_run on programs
 * without a count of their own). Returns the count now in effect. */
int rt_set_threads(int n);
/* The team every rt_run of p uses, on the calling thread for the run only
 * (0: the caller's, as it is): n threads, or fewer for runs where fewer
 * measured faster unless fixed (team.c). kiln_compile_with sets the
 * program's; rt_compile leaves a program at 0. */
void rt_set_program_threads(RtProgram *p, int n, bool fixed);
/* A copy of p's team state: the levels, the runs at each (reports). */
RtTeam rt_team(RtProgram *p);
/* Runs made so far for p's pool: the most that ran at once. */
int rt_runs(RtProgram *p);
/* Arena offset of buffer b, or -1 when it does not live in the arena. */
int64_t rt_buffer_offset(const RtProgram *p, int b);

/* The lowering and scheduling configuration for public options (fuse 0:
 * nothing inlined, no fusion rounds: one kernel per op). */
KilnConfig rt_config(const kiln_options *o);

/* The runtime object behind a public kiln_program (CLI: stats, schedule). */
RtProgram *kiln_program_rt(kiln_program *p);

#endif
