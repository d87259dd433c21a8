/*
 * main.c -- the kiln command line.
 *
 * Each command is a small function over the library: parse the program,
 * bind inputs (from .npy files, or generated from --seed), run, write
 * outputs. Only this file prints for the user and calls exit; the library
 * returns statuses and messages.
 *
 * Exit status: 0 success; 1 bad input (program, data file, shapes);
 * 2 bad usage; 3 environment failure (I/O, compiler); 4 out of memory;
 * 5 --check found a mismatch.
 */
#include "cli/cli.h"
#include <time.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

enum { EXIT_INPUT = 1, EXIT_USAGE = 2, EXIT_ENV = 3, EXIT_NOMEM = 4, EXIT_CHECK = 5 };

static int exit_for(kiln_status st) {
    switch (st) {
    case KILN_OK: return 0;
    case KILN_ERR_INPUT: return EXIT_INPUT;
    case KILN_ERR_ENV: return EXIT_ENV;
    case KILN_ERR_NOMEM: return EXIT_NOMEM;
    }
    return EXIT_INPUT;
}

static const char *usage_main =
    "usage: kiln COMMAND [ARGS]\n"
    "\n"
    "kiln is an operator-fusing tensor compiler: it reads a tensor program\n"
    "(.kiln text, or an ONNX model .onnx), fuses its operations into few loop\n"
    "nests and runs them.\n"
    "\n"
    "commands:\n"
    "  run PROG       compile a program to fused kernels, run it, write its outputs\n"
    "  explain PROG   why operations fused or did not: rounds, kernels, traffic\n"
    "  code PROG      print the generated C source\n"
    "  bench PROG     time the unfused interpreter against the fused kernels\n"
    "  dot PROG       Graphviz of the program, ops coloured by kernel\n"
    "  onnx-test DIR...  run ONNX backend conformance tests (make conformance)\n"
    "  help [CMD]     show help for a command\n"
    "\n"
    "KILN_LOGS=rewrite,fusion,schedule,inline,loop_ir,team (or all) logs each stage on stderr.\n"
    "KILN_TARGET=v2|v3|v4|native (or --target on any command) picks the instruction\n"
    "set kernels are compiled for; default: the highest tier this CPU runs.\n"
    "KILN_PROFILE=1 prints where each run's time went (every kernel and library\n"
    "call) on stderr; KILN_TRACE=FILE.json also writes a Chrome trace. See\n"
    "'kiln help bench' (--profile, --trace).\n"
    "\n"
    "Run 'kiln help run' for the options of a command.\n";

static const char *usage_run =
    "usage: kiln run PROG [-i NAME=FILE.npy]... [--shape NAME=D0,D1,...]... [--seed N]\n"
    "                     [-o DIR] [--threads N] [--check] [--interpret]\n"
    "                     [--report FILE.json] [--no-extern-epilogue] [--target T]\n"
    "\n"
    "Compile PROG (.kiln, or an ONNX model .onnx) into fused kernels and run\n"
    "it. Inputs not given with -i are filled deterministically from --seed\n"
    "(default 0): f32 inputs with standard normal values, bool inputs with\n"
    "fair coin flips.\n"
    "\n"
    "  -i NAME=FILE.npy    bind input NAME to a .npy file, or an ONNX tensor\n"
    "                      .pb (dtype and shape must match the declaration;\n"
    "                      an ONNX model's int inputs take int32/int64 files)\n"
    "  --shape NAME=D0,D1,...  the shape of ONNX input NAME where the model\n"
    "                      leaves dims symbolic or unknown (a file given with\n"
    "                      -i gives its shape too, and its value where the\n"
    "                      model needs one at import: a Reshape's shape)\n"
    "  --seed N            seed for generated inputs\n"
    "  -o DIR              write each output as DIR/NAME.npy; without -o a\n"
    "                      summary of each output is printed (an ONNX\n"
    "                      model's outputs by their ONNX names and types)\n"
    "  --threads N         threads for kernels and BLAS (default:\n"
    "                      $KILN_NUM_THREADS, else every core)\n"
    "  --check             also run the reference interpreter and compare;\n"
    "                      exit 5 on a mismatch (tolerances: docs/tolerances.md)\n"
    "  --interpret         run the reference interpreter only (no compiler)\n"
    "  --report FILE.json  write the fusion decisions, calls, traffic, timing\n"
    "                      and check result as JSON\n"
    "  --no-extern-epilogue  keep library calls (matmul, conv2d,\n"
    "                      conv_transpose2d, gather) walls, as PyTorch\n"
    "                      Inductor does: their pointwise consumers\n"
    "                      (bias, BN, relu, a residual add) become kernels of\n"
    "                      their own instead of running on each output block\n"
    "                      inside the call\n"
    "  --target T          the instruction-set tier the kernels are compiled\n"
    "                      for: v2 (x86-64-v2, SSE4.2), v3 (AVX2 + FMA), v4\n"
    "                      (AVX-512) or native (-march=native); default\n"
    "                      $KILN_TARGET, else the highest this CPU runs. A\n"
    "                      tier this CPU cannot run exits 3, naming what it\n"
    "                      lacks; library kernels (OpenBLAS, oneDNN, kiln's\n"
    "                      own) stay within the tier too\n";

static const char *usage_code =
    "usage: kiln code PROG [--no-extern-epilogue] [--shape NAME=D0,D1,...]... [--target T]\n"
    "\n"
    "Print the C source kiln generates for PROG: one function per fused\n"
    "kernel, named from the ops it holds, and the entry point that calls the\n"
    "kernels and library calls in order. KILN_LOGS=output_code prints the\n"
    "same source on stderr from any command that compiles. An extern call's\n"
    "epilogue is a function epi_<k> the library calls on each output block;\n"
    "--no-extern-epilogue generates kernels of their own instead (as 'run').\n";

static const char *usage_bench =
    "usage: kiln bench PROG [-i NAME=FILE.npy]... [--seed N] [--threads N]\n"
    "                       [--fixed-threads] [--repeat N] [--report FILE.json]\n"
    "                       [--no-extern-epilogue] [--shape NAME=D0,D1,...]... [--target T]\n"
    "                       [--profile] [--trace FILE.json] [--fused-only]\n"
    "\n"
    "Time PROG three ways: the reference interpreter (one thread, every op by\n"
    "itself), unfused compiled kernels (one kernel per op, every intermediate\n"
    "in memory: the eager baseline, same threads), and the fused kernels: the\n"
    "median of --repeat runs (default 10) after a warm-up, the bytes each\n"
    "moves and the bandwidth that amounts to. Compiled runs write into outputs\n"
    "allocated once, as a serving loop would (kiln_program_run_into); compile\n"
    "time is measured apart. The warm-up is one run, and for a program of\n"
    "several threads as many more as it takes to time each team size a run\n"
    "may use (at most 0.5 s): a run uses fewer threads where fewer measured\n"
    "faster, a core kept busy by another process (kiln.h, Threads); the line\n"
    "'team:' says which sizes the timed runs used. --fixed-threads runs every\n"
    "run on --threads threads. --report writes fused_ms, unfused_ms (the\n"
    "unfused kernels), interp_ms, compile_ms, bytes_fused, bytes_unfused,\n"
    "threads and peak_rss_kib (the process's peak resident memory, measured).\n"
    "--no-extern-epilogue compiles the fused program with library calls as\n"
    "walls (as 'run').\n"
    "\n"
    "  --fused-only       time the fused kernels alone (no interpreter, no\n"
    "                     unfused kernels; --report has them as 0); the graph\n"
    "                     is freed once compiled, as a deployment would, so\n"
    "                     the peak memory is the program's\n"
    "  --profile          then --repeat more fused runs, profiled: every kernel\n"
    "                     and library call, slowest first, with its time, share,\n"
    "                     bytes moved, GB/s, GFLOP/s (matmul and conv), threads\n"
    "                     busy and what ran it; a summary by kind; the profiled\n"
    "                     median beside the plain one (the profiler's overhead)\n"
    "  --trace FILE.json  --profile, and every span of those runs as a Chrome\n"
    "                     trace, a track per thread (Perfetto, chrome://tracing)\n"
    "KILN_PROFILE=1 (and KILN_TRACE=FILE.json) profile any command's runs, and\n"
    "any program of the C API, printed when the program is freed.\n";

static const char *usage_explain =
    "usage: kiln explain PROG [--report FILE.json] [--no-extern-epilogue]\n"
    "                         [--shape NAME=D0,D1,...]... [--target T]\n"
    "\n"
    "Explain how kiln fuses PROG: the scheduler nodes before fusion, each\n"
    "round's candidate pairs with the decision and its reason, the final\n"
    "kernels (name from origins, kind, loop nests), the call sequence, the\n"
    "memory traffic unfused vs fused, and the peak memory.\n"
    "\n"
    "  --report FILE.json  also write the decisions as JSON\n"
    "  --no-extern-epilogue  library calls are walls (see 'kiln help run')\n"
    "  --shape NAME=D0,D1,...  an ONNX model's input shape (see 'kiln help run')\n"
    "  --target T          the instruction-set tier (see 'kiln help run'); the\n"
    "                      explanation opens with it and its compiler flags\n";

static const char *usage_onnx_test =
    "usage: kiln onnx-test [-v] [--interpret] [--threads N] [--target T] DIR...\n"
    "\n"
    "Run ONNX backend conformance tests: each DIR is a test (model.onnx and\n"
    "test_data_set_N/ with input_K.pb and output_K.pb) or a folder of tests.\n"
    "Each model is compiled once (fused) and run on every data set; outputs\n"
    "must match with ONNX's tolerances (rtol 1e-3, atol 1e-7). Prints each\n"
    "failure and per folder the passed, failed and unsupported counts (ops\n"
    "or element types kiln does not cover). -v also lists each unsupported\n"
    "test and why; --interpret also checks the reference interpreter.\n"
    "Exit status 1 when a test failed.\n";

static const char *usage_dot =
    "usage: kiln dot PROG [-o FILE] [--shape NAME=D0,D1,...]... [--target T]\n"
    "\n"
    "Print the program as a Graphviz graph, each op coloured by the kernel it\n"
    "landed in. With -o FILE.svg or FILE.png the graph is rendered with\n"
    "Graphviz's dot (apt-get install graphviz); with -o FILE.dot it is saved.\n";

/* ---- options -------------------------------------------------------------- */

#define MAX_BINDINGS 64

/* Which options a command accepts. */
enum {
    OPT_INPUTS = 1 << 0,
    OPT_SEED = 1 << 1,
    OPT_OUT = 1 << 2,
    OPT_REPORT = 1 << 3,
    OPT_THREADS = 1 << 4,
    OPT_CHECK = 1 << 5,
    OPT_INTERPRET = 1 << 6,
    OPT_REPEAT = 1 << 7,
    OPT_NOFUSE = 1 << 8,
    OPT_NOEPILOGUE = 1 << 9,
    OPT_SHAPE = 1 << 10,
    OPT_TARGET = 1 << 11,
    OPT_FIXED = 1 << 12,
    OPT_PROFILE = 1 << 13,
    OPT_TRACE = 1 << 14,
    OPT_FUSED_ONLY = 1 << 15,
};

/* The options: spelling, bit, and whether a value follows. */
static const struct {
    const char *name;
    unsigned bit;
    bool value;
} option_table[] = {
    {"-i", OPT_INPUTS, true},
    {"--seed", OPT_SEED, true},
    {"-o", OPT_OUT, true},
    {"--report", OPT_REPORT, true},
    {"--threads", OPT_THREADS, true},
    {"--check", OPT_CHECK, false},
    {"--interpret", OPT_INTERPRET, false},
    {"--repeat", OPT_REPEAT, true},
    {"--no-fuse", OPT_NOFUSE, false},
    {"--no-extern-epilogue", OPT_NOEPILOGUE, false},
    {"--shape", OPT_SHAPE, true},
    {"--target", OPT_TARGET, true},
    {"--fixed-threads", OPT_FIXED, false},
    {"--profile", OPT_PROFILE, false},
    {"--trace", OPT_TRACE, true},
    {"--fused-only", OPT_FUSED_ONLY, false},
};

typedef struct {
    const char *prog;
    const char *bind_name[MAX_BINDINGS];
    const char *bind_file[MAX_BINDINGS];
    int nbind;
    kiln_onnx_input shapes[MAX_BINDINGS]; /* --shape, for ONNX models */
    int nshapes;
    uint64_t seed;
    const char *outdir; /* run: a directory; dot: a file */
    const char *report;
    int threads; /* 0: $KILN_NUM_THREADS or every core */
    int repeat;  /* bench */
    bool check, interpret, nofuse;
    bool no_epilogue;   /* externs are walls, as in Inductor */
    bool fixed_threads; /* bench: every run on --threads threads */
    bool profile;       /* bench: every call's time */
    bool fused_only;    /* bench: neither the interpreter nor the unfused kernels */
    const char *trace;  /* bench: a Chrome trace of the profiled runs */
    const char *target; /* --target, else $KILN_TARGET (NULL: the best tier) */
} Options;

static int enter_target(const char *name);

typedef struct {
    const char *name;
    int (*run)(const Options *);
    const char *const *usage;
    unsigned opts;
} Command;

static int usage_error(const char *usage, const char *fmt, const char *arg) {
    fprintf(stderr, "kiln: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n\n%s", usage);
    return EXIT_USAGE;
}

static bool parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-') return false;
    *out = v;
    return true;
}

static bool parse_count(const char *s, int lo, int hi, int *out) {
    uint64_t v;
    if (!parse_u64(s, &v) || v < (uint64_t)lo || v > (uint64_t)hi) return false;
    *out = (int)v;
    return true;
}

/* NAME=D0,D1,... into a shape binding (NAME= alone: a scalar). The name
 * points into s, which is cut at '='. */
static bool parse_shape(char *s, kiln_onnx_input *out) {
    char *eq = strrchr(s, '=');
    if (!eq || eq == s) return false;
    *out = (kiln_onnx_input){s, 0, {0}, NULL};
    for (char *p = eq + 1; *p;) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (errno || end == p || v <= 0 || out->rank == KILN_MAX_RANK) return false;
        out->shape[out->rank++] = v;
        if (*end == ',' && end[1])
            p = end + 1;
        else if (*end)
            return false;
        else
            p = end;
    }
    *eq = 0;
    return true;
}

/* The field an option without a value sets, or NULL (it takes a value). */
static bool *option_flag(Options *o, unsigned bit) {
    switch (bit) {
    case OPT_CHECK: return &o->check;
    case OPT_INTERPRET: return &o->interpret;
    case OPT_NOFUSE: return &o->nofuse;
    case OPT_NOEPILOGUE: return &o->no_epilogue;
    case OPT_FIXED: return &o->fixed_threads;
    case OPT_PROFILE: return &o->profile;
    case OPT_FUSED_ONLY: return &o->fused_only;
    default: return NULL;
    }
}

/* One option and its value; returns 0 or an exit status. */
static int parse_option(const Command *c, char **argv, int argc, int *i, Options *o) {
    const char *a = argv[*i], *u = *c->usage;
    char *val_w;
    size_t k = 0, n = sizeof option_table / sizeof option_table[0];
    while (k < n && strcmp(option_table[k].name, a)) k++;
    if (k == n || !(c->opts & option_table[k].bit)) return usage_error(u, "unknown option '%s'", a);
    unsigned bit = option_table[k].bit;
    bool *flag = option_flag(o, bit);
    if (flag) {
        *flag = true;
        return 0;
    }
    if (*i + 1 >= argc) return usage_error(u, "%s needs a value", a);
    const char *val = argv[++*i];
    val_w = argv[*i];
    if (bit == OPT_INPUTS) {
        char *eq = strchr(argv[*i], '=');
        if (!eq || eq == argv[*i] || !eq[1])
            return usage_error(u, "-i expects NAME=FILE.npy, got '%s'", argv[*i]);
        if (o->nbind == MAX_BINDINGS) return usage_error(u, "%s", "too many -i options");
        *eq = 0;
        o->bind_name[o->nbind] = argv[*i];
        o->bind_file[o->nbind++] = eq + 1;
    } else if (bit == OPT_SHAPE) {
        if (o->nshapes == MAX_BINDINGS) return usage_error(u, "%s", "too many --shape options");
        if (!parse_shape(val_w, &o->shapes[o->nshapes]))
            return usage_error(u, "--shape expects NAME=D0,D1,... (positive dims), got '%s'", val);
        o->nshapes++;
    } else if (bit == OPT_SEED) {
        if (!parse_u64(val, &o->seed))
            return usage_error(u, "--seed needs a non-negative integer, got '%s'", val);
    } else if (bit == OPT_THREADS) {
        if (!parse_count(val, 1, 1024, &o->threads))
            return usage_error(u, "--threads needs a count from 1 to 1024, got '%s'", val);
    } else if (bit == OPT_REPEAT) {
        if (!parse_count(val, 1, 100000, &o->repeat))
            return usage_error(u, "--repeat needs a count from 1 to 100000, got '%s'", val);
    } else if (bit == OPT_OUT) {
        o->outdir = val;
    } else if (bit == OPT_TARGET) {
        o->target = val;
    } else if (bit == OPT_TRACE) {
        o->trace = val;
        o->profile = true;
    } else {
        o->report = val;
    }
    return 0;
}

static int parse_args(const Command *c, int argc, char **argv, Options *o) {
    memset(o, 0, sizeof *o);
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int rc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(*c->usage, stdout);
            return -1;
        } else if (a[0] == '-' && a[1]) {
            if ((rc = parse_option(c, argv, argc, &i, o))) return rc;
        } else if (o->prog) {
            return usage_error(*c->usage, "unexpected argument '%s'", a);
        } else {
            o->prog = a;
        }
    }
    if (!o->prog) return usage_error(*c->usage, "%s", "no program given");
    return 0;
}

/* ---- inputs and outputs ------------------------------------------------ */

static void free_tensors(kiln_tensor *t, int n) {
    for (int i = 0; t && i < n; i++) kiln_tensor_free(&t[i]);
    kfree(t);
}

/* Generated input i: its own stream of the seed, so inputs differ. An
 * ONNX int input (integer) gets integers from 0 to 9. */
static kiln_status generate_input(kiln_tensor *t, uint64_t seed, int i, bool integer) {
    kiln_status st = kiln_tensor_alloc(t);
    if (st != KILN_OK) return st;
    int64_t n = kiln_tensor_numel(t);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + (uint64_t)i;
    if (t->dtype == KILN_F32 && integer) {
        for (int64_t k = 0; k < n; k++)
            ((float *)t->data)[k] = floorf(util_rand_uniform(s, (uint64_t)k) * 10);
    } else if (t->dtype == KILN_F64 && integer) { /* an ONNX int32/int64 input */
        for (int64_t k = 0; k < n; k++)
            ((double *)t->data)[k] = floor(util_rand_uniform(s, (uint64_t)k) * 10);
    } else if (t->dtype == KILN_F32) {
        kiln_fill_randn(t->data, n, s);
    } else if (t->dtype == KILN_F64) { /* the same normal values, as doubles */
        float *f = kmalloc(sizeof(float) * (size_t)(n ? n : 1));
        if (!f) return kiln_tensor_free(t), KILN_ERR_NOMEM;
        kiln_fill_randn(f, n, s);
        for (int64_t k = 0; k < n; k++) ((double *)t->data)[k] = f[k];
        kfree(f);
    } else {
        uint8_t *b = t->data;
        for (int64_t k = 0; k < n; k++) b[k] = util_rand_uniform(s, (uint64_t)k) < 0.5f;
    }
    return KILN_OK;
}

static int find_binding(const Options *o, const char *name) {
    for (int b = 0; b < o->nbind; b++)
        if (!strcmp(o->bind_name[b], name)) return b;
    return -1;
}

static bool ends_with(const char *s, const char *suffix);

/* A tensor file: an ONNX TensorProto (.pb) or a .npy file. */
static kiln_status read_tensor(const char *path, kiln_tensor *t, char *err, size_t errlen) {
    return ends_with(path, ".pb") ? kiln_pb_read(path, t, err, errlen)
                                  : kiln_npy_read(path, t, err, errlen);
}

/* An ONNX model's input in the graph's dtype: int32/int64 files become f32
 * (exactly, or an error). .kiln programs take the declared dtype only. */
static kiln_status convert_input(const kiln_graph *g, int i, const char *path, kiln_tensor *t,
                                 char *err, size_t errlen) {
    kiln_dtype want = kiln_input_desc(g, i).dtype;
    if (t->dtype == want || t->dtype == KILN_F64 || t->dtype == KILN_BOOL || want == KILN_BOOL)
        return KILN_OK;
    kiln_tensor c;
    char msg[512];
    kiln_status st = kiln_tensor_convert(t, want, &c, msg, sizeof msg);
    if (st != KILN_OK) {
        util_fmt(err, errlen, "%s: %s", path, msg);
        return st;
    }
    kiln_tensor_free(t);
    *t = c;
    return KILN_OK;
}

/* Bind every input: from its -i file, or generated. */
static int load_inputs(const kiln_graph *g, const Options *o, const kiln_onnx_io *io,
                       kiln_tensor **out) {
    bool onnx = io->output_type != NULL;
    int n = kiln_num_inputs(g);
    for (int b = 0; b < o->nbind; b++) {
        bool known = false;
        for (int i = 0; i < n; i++) known |= !strcmp(kiln_input_name(g, i), o->bind_name[b]);
        if (!known) {
            fprintf(stderr, "kiln: %s: the program has no input '%s'\n", o->prog, o->bind_name[b]);
            return EXIT_INPUT;
        }
    }
    kiln_tensor *t = kcalloc((size_t)(n ? n : 1), sizeof *t);
    if (!t) return EXIT_NOMEM;
    for (int i = 0; i < n; i++) {
        int b = find_binding(o, kiln_input_name(g, i));
        char err[1024] = "";
        kiln_status st;
        if (b >= 0) {
            st = read_tensor(o->bind_file[b], &t[i], err, sizeof err);
            if (st == KILN_OK && onnx)
                st = convert_input(g, i, o->bind_file[b], &t[i], err, sizeof err);
        } else {
            t[i] = kiln_input_desc(g, i);
            kiln_dtype ot = onnx ? io->input_type[i] : KILN_F32;
            st = generate_input(&t[i], o->seed, i,
                                ot != KILN_F32 && ot != KILN_F64 && ot != KILN_BOOL);
            if (st)
                util_fmt(err, sizeof err, "out of memory: %.3g bytes for input '%s'",
                         (double)kiln_tensor_numel(&t[i]) * (double)kiln_dtype_size(t[i].dtype),
                         kiln_input_name(g, i));
        }
        if (st != KILN_OK) {
            fprintf(stderr, "kiln: %s\n", err);
            free_tensors(t, n);
            return exit_for(st);
        }
    }
    *out = t;
    return 0;
}

/* Element k of an output (f32, f64 or bool). */
static double element(const kiln_tensor *t, int64_t k) {
    return t->dtype == KILN_BOOL  ? ((uint8_t *)t->data)[k]
           : t->dtype == KILN_F64 ? ((double *)t->data)[k]
                                  : ((float *)t->data)[k];
}

/* An output's summary line, under the type the model gives it (an ONNX
 * model's int64 output is held as f32 or f64 in the graph). */
static void print_summary(const char *name, const kiln_tensor *t, kiln_dtype shown) {
    char shape[160];
    graph_shape_str(shape, sizeof shape, t->rank, t->shape);
    int64_t n = kiln_tensor_numel(t);
    double sum = 0;
    printf("%s: %s%s", name, kiln_dtype_name(shown), shape);
    for (int64_t k = 0; k < n; k++) sum += element(t, k);
    if (n == 0) {
        printf("  empty\n");
        return;
    }
    printf("  mean %.6g  [", sum / (double)n);
    for (int64_t k = 0; k < n && k < 6; k++) { printf("%s%.6g", k ? ", " : "", element(t, k)); }
    printf("%s]\n", n > 6 ? ", ..." : "");
}

/* An output's file and the temporary name it is written under first. */
typedef struct {
    char path[4096], tmp[4200];
} OutFile;

/* An output's file name: its name with every character outside
 * [A-Za-z0-9._-] as '_' (ONNX names such as 'save_infer_model/scale_0'
 * hold slashes), and ".npy". */
static void output_file(char *buf, size_t len, const char *dir, const char *name) {
    char safe[512];
    size_t k = 0;
    for (; name[k] && k + 1 < sizeof safe; k++)
        safe[k] = isalnum((unsigned char)name[k]) || strchr("._-", name[k]) ? name[k] : '_';
    safe[k] = 0;
    util_fmt(buf, len, "%s/%s.npy", dir, safe);
}

/* Write output i to its temporary name beside f->path (set by the
 * caller); 0 or an exit status. A message from the writer names the
 * target, not the temporary. */
static int stage_output(const kiln_onnx_io *io, const kiln_tensor *t, int i, OutFile *f) {
    char err[1024];
    util_fmt(f->tmp, sizeof f->tmp, "%s.tmp.%d.all", f->path, (int)getpid());
    kiln_tensor c = *t;
    kiln_status s = KILN_OK;
    if (io && io->output_type[i] != t->dtype) /* an ONNX int output (ArgMax) */
        s = kiln_tensor_convert(t, io->output_type[i], &c, err, sizeof err);
    if (s == KILN_OK) s = kiln_npy_write(f->tmp, &c, err, sizeof err);
    if (c.data != t->data) kiln_tensor_free(&c);
    if (s == KILN_OK) return 0;
    size_t k = strlen(f->tmp);
    const char *rest = strncmp(err, f->tmp, k) ? NULL : err + k;
    if (rest)
        fprintf(stderr, "kiln: %s%s\n", f->path, rest);
    else
        fprintf(stderr, "kiln: %s\n", err);
    return exit_for(s);
}

/* Rename every staged file into place. When one fails, those already in
 * place are removed too, so a run leaves all of its outputs or none. */
static int commit_outputs(OutFile *f, int n) {
    for (int i = 0; i < n; i++) {
        if (rename(f[i].tmp, f[i].path) == 0) continue;
        fprintf(stderr, "kiln: cannot write %s: %s\n", f[i].path, strerror(errno));
        for (int j = 0; j < i; j++) remove(f[j].path);
        for (int j = i; j < n; j++) remove(f[j].tmp);
        return EXIT_ENV;
    }
    return 0;
}

/* Write every output, or nothing: the directory is checked first, each
 * file is written under a temporary name, and only when all are written
 * are they renamed into place. */
static int write_outputs(const kiln_graph *g, const Options *o, const kiln_onnx_io *io,
                         kiln_tensor *outs) {
    int n = kiln_num_outputs(g);
    if (!o->outdir) {
        for (int i = 0; i < n; i++)
            print_summary(kiln_output_name(g, i), &outs[i],
                          io && io->output_type ? io->output_type[i] : outs[i].dtype);
        return 0;
    }
    struct stat st;
    if (stat(o->outdir, &st) != 0) {
        fprintf(stderr, "kiln: output directory '%s' %s\n", o->outdir,
                errno == ENOENT ? "does not exist" : strerror(errno));
        return EXIT_ENV;
    }
    if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "kiln: output directory '%s' is not a directory\n", o->outdir);
        return EXIT_ENV;
    }
    if (access(o->outdir, W_OK) != 0) {
        fprintf(stderr, "kiln: output directory '%s' is not writable: %s\n", o->outdir,
                strerror(errno));
        return EXIT_ENV;
    }
    OutFile *f = kcalloc((size_t)(n ? n : 1), sizeof *f);
    if (!f) return EXIT_NOMEM;
    for (int i = 0; i < n; i++) { /* two names may map to one file name */
        output_file(f[i].path, sizeof f[i].path, o->outdir, kiln_output_name(g, i));
        for (int j = 0; j < i; j++)
            if (!strcmp(f[i].path, f[j].path)) {
                fprintf(stderr, "kiln: outputs '%s' and '%s' would both be written to %s\n",
                        kiln_output_name(g, j), kiln_output_name(g, i), f[i].path);
                kfree(f);
                return EXIT_INPUT;
            }
    }
    int rc = 0, staged = 0;
    while (!rc && staged < n) {
        rc = stage_output(io, &outs[staged], staged, &f[staged]);
        if (!rc) staged++;
    }
    if (rc) {
        for (int j = 0; j < staged; j++) remove(f[j].tmp);
    } else {
        rc = commit_outputs(f, n);
    }
    kfree(f);
    return rc;
}

/* ---- commands ------------------------------------------------------------ */

/* What an ONNX import is told of its inputs: --shape, then the files
 * given with -i, shape and value. A run (or bench) uses those very values,
 * so the model is specialized to them: an int input that sets a shape (a
 * Reshape's shape) becomes a constant. vals[] receives the tensors read. */
static int onnx_inputs(const Options *o, kiln_onnx_input *s, kiln_tensor *vals, int *n) {
    *n = o->nshapes;
    memcpy(s, o->shapes, sizeof(kiln_onnx_input) * (size_t)o->nshapes);
    for (int b = 0; b < o->nbind; b++) {
        bool given = false;
        for (int k = 0; k < o->nshapes; k++) given |= !strcmp(o->shapes[k].name, o->bind_name[b]);
        if (given) continue;
        char err[1024];
        kiln_status st = read_tensor(o->bind_file[b], &vals[b], err, sizeof err);
        if (st != KILN_OK) {
            fprintf(stderr, "kiln: %s\n", err);
            return exit_for(st);
        }
        s[*n] = (kiln_onnx_input){o->bind_name[b], vals[b].rank, {0}, &vals[b]};
        memcpy(s[(*n)++].shape, vals[b].shape, sizeof vals[b].shape);
    }
    return 0;
}

static kiln_status import_onnx(kiln_graph *g, const Options *o, kiln_onnx_io *io, int *rc) {
    kiln_onnx_input s[2 * MAX_BINDINGS];
    kiln_tensor vals[MAX_BINDINGS] = {{0}};
    int n;
    kiln_status st = KILN_ERR_INPUT;
    if (!(*rc = onnx_inputs(o, s, vals, &n))) st = kiln_onnx_import(g, o->prog, n, s, io);
    for (int b = 0; b < o->nbind; b++) kiln_tensor_free(&vals[b]);
    return st;
}

/* Parse a .kiln program or import an ONNX model; io receives the model's
 * boundary types (all zero for a .kiln program: output_type NULL). */
static int load_program(const Options *o, kiln_graph **out, kiln_onnx_io *io) {
    const char *path = o->prog;
    kiln_graph *g = kiln_graph_new();
    int rc = 0;
    if (!g) {
        fprintf(stderr, "kiln: out of memory\n");
        return EXIT_NOMEM;
    }
    bool onnx = ends_with(path, ".onnx");
    if (!onnx && o->nshapes)
        fprintf(stderr, "kiln: warning: --shape applies to ONNX models only\n");
    *io = (kiln_onnx_io){0};
    kiln_status st = onnx ? import_onnx(g, o, io, &rc) : kiln_parse_file(g, path);
    if (rc) {
        kiln_graph_free(g);
        return rc;
    }
    if (st != KILN_OK) {
        fprintf(stderr, "%s\n", kiln_error(g));
        kiln_graph_free(g);
        return exit_for(st);
    }
    *out = g;
    return 0;
}

/* What --check found: the worst element over all outputs. */
typedef struct {
    bool done, passed;
    double max_abs, worst_excess;
    int worst_output;
    int64_t worst_index;
    double got, want;
    int64_t conditioned; /* elements over the tolerance that the reference's spread accepts */
    float spread;        /* the worst element's spread (with spread only) */
} Check;

/* Compare fused outputs with the interpreter's, with the per-class
 * tolerance of the program (bool outputs must match exactly); with
 * spread (rt_reference_spread), an element over the tolerance that the
 * reference's own spread covers passes and is counted. */
static void compare(const kiln_graph *g, const RtTolerance *tol, const kiln_tensor *got,
                    const kiln_tensor *want, const kiln_tensor *spread, Check *c) {
    *c = (Check){.done = true, .passed = true, .worst_output = -1};
    for (int i = 0; i < kiln_num_outputs(g); i++) {
        for (int64_t k = 0; k < kiln_tensor_numel(&got[i]); k++) {
            double a = element(&got[i], k), b = element(&want[i], k);
            double ex = rt_check_excess(got[i].dtype, a, b, 0.0f, *tol);
            float sp = spread ? ((const float *)spread[i].data)[k] : 0.0f;
            if (ex > 1 && spread) {
                ex = rt_check_excess(got[i].dtype, a, b, sp, *tol);
                c->conditioned += ex <= 1;
            }
            if (isfinite(a) && isfinite(b) && fabs((double)a - b) > c->max_abs)
                c->max_abs = fabs((double)a - b);
            if (ex > 1 || c->worst_output < 0 || ex > c->worst_excess) {
                if (ex > 1) c->passed = false;
                if (c->worst_output >= 0 && ex <= c->worst_excess) continue;
                c->worst_excess = ex;
                c->worst_output = i;
                c->worst_index = k;
                c->got = a;
                c->want = b;
                c->spread = sp;
            }
        }
    }
}

/* The run's extra JSON report members. */
typedef struct {
    const Check *check;
    const RtStats *stats;
    double fused_ms;
    int threads;
} RunReport;

static void run_report_fn(FILE *f, void *ud) {
    const RunReport *r = ud;
    if (r->check && r->check->done)
        fprintf(f, ",\n \"check\": {\"passed\": %s, \"max_abs_error\": %.9g}",
                r->check->passed ? "true" : "false", r->check->max_abs);
    if (r->stats)
        fprintf(f,
                ",\n \"compile_ms\": %.3f, \"cache_hit\": %s, \"fused_ms\": %.3f, "
                "\"threads\": %d",
                r->stats->compile_ms, r->stats->cache_hit ? "true" : "false", r->fused_ms,
                r->threads);
}

typedef struct {
    const Schedule *sched;
    ReportHooks hooks;
} JsonArgs;

static void json_fn(FILE *f, void *ud) {
    JsonArgs *a = ud;
    report_json(f, a->sched, a->hooks.fn ? &a->hooks : NULL);
    fputc('\n', f);
}

static int write_file_atomic(const char *path, void (*fn)(FILE *, void *), void *ud);

/* Run the interpreter into ref[] and compare; prints the verdict. */
static int check_against_interpreter(kiln_graph *g, kiln_program *p, const kiln_tensor *in,
                                     const kiln_tensor *out, Check *c) {
    int nout = kiln_num_outputs(g);
    kiln_tensor *ref = kcalloc((size_t)(nout ? nout : 1), sizeof *ref);
    if (!ref) return EXIT_NOMEM;
    kiln_status st = kiln_interpret(g, in, ref);
    if (st != KILN_OK) {
        fprintf(stderr, "kiln: interpreter: %s\n", kiln_error(g));
        free_tensors(ref, nout);
        return exit_for(st);
    }
    RtTolerance tol = rt_tolerance(rt_graph(kiln_program_rt(p)));
    compare(g, &tol, out, ref, NULL, c);
    kiln_tensor *spread = NULL;
    if (!c->passed) { /* measure again against the reference's own spread */
        spread = kcalloc((size_t)(nout ? nout : 1), sizeof *spread);
        st = spread ? rt_reference_spread(g, in, ref, RT_SPREAD_RUNS, spread) : KILN_ERR_NOMEM;
        if (st != KILN_OK) {
            fprintf(stderr, "kiln: interpreter: %s\n", spread ? kiln_error(g) : "out of memory");
            kfree(spread);
            free_tensors(ref, nout);
            return exit_for(st);
        }
        compare(g, &tol, out, ref, spread, c);
        free_tensors(spread, nout);
    }
    free_tensors(ref, nout);
    if (c->passed) {
        fprintf(stderr, "check: passed (%d outputs match the interpreter; max abs error %.3g)\n",
                nout, c->max_abs);
        if (c->conditioned)
            fprintf(stderr,
                    "check: %lld element(s) beyond the tolerance are ill-conditioned: the "
                    "interpreter itself moves them that far when its intermediate values "
                    "are nudged by rounding-sized amounts (docs/tolerances.md)\n",
                    (long long)c->conditioned);
        return 0;
    }
    fprintf(stderr,
            "check: FAILED: output '%s' element %lld is %.9g, the interpreter says %.9g "
            "(tolerance %.3g + %.3g*|want| + %g * %.3g, the reference's own spread there)\n",
            kiln_output_name(g, c->worst_output), (long long)c->worst_index, c->got, c->want,
            tol.atol, tol.rtol, RT_SPREAD_K, c->spread);
    return EXIT_CHECK;
}

static kiln_options compile_options(const Options *o, bool fuse) {
    kiln_options k = kiln_default_options();
    k.threads = o->threads;
    k.fuse = fuse && !o->nofuse;
    k.extern_epilogue = !o->no_epilogue;
    k.target = o->target;
    k.fixed_threads = o->fixed_threads;
    return k;
}

static int compile_program(kiln_graph *g, const Options *o, kiln_program **p) {
    kiln_options k = compile_options(o, true);
    kiln_status st = kiln_compile_with(g, &k, p);
    if (st == KILN_OK) return 0;
    fprintf(stderr, "kiln: %s: %s\n", o->prog, kiln_error(g));
    return exit_for(st);
}

/* The fused run: compile, run, maybe check and report. */
static int run_fused(kiln_graph *g, const Options *o, const kiln_tensor *in, kiln_tensor *out) {
    kiln_program *p = NULL;
    int rc = compile_program(g, o, &p);
    if (rc) return rc;
    double t0 = util_now_ms();
    kiln_status st = kiln_program_run(p, in, out);
    RunReport rr = {NULL, rt_stats(kiln_program_rt(p)), util_now_ms() - t0,
                    kiln_program_threads(p)};
    Check c = {0};
    if (st != KILN_OK) {
        fprintf(stderr, "kiln: %s: %s\n", o->prog, kiln_program_error(p));
        rc = exit_for(st);
    } else if (o->check) {
        rc = check_against_interpreter(g, p, in, out, &c);
        rr.check = &c;
    }
    if (o->report && (!rc || rc == EXIT_CHECK)) {
        JsonArgs a = {rt_schedule(kiln_program_rt(p)), {run_report_fn, &rr}};
        int wrc = write_file_atomic(o->report, json_fn, &a);
        if (!rc) rc = wrc;
    }
    kiln_program_free(p);
    return rc;
}

static int cmd_run(const Options *o) {
    kiln_graph *g = NULL;
    kiln_onnx_io io;
    int rc = load_program(o, &g, &io);
    if (rc) return rc;
    kiln_tensor *in = NULL, *out = NULL;
    int nout = kiln_num_outputs(g);
    if ((rc = load_inputs(g, o, &io, &in))) goto done;
    out = kcalloc((size_t)(nout ? nout : 1), sizeof *out);
    if (!out) {
        rc = EXIT_NOMEM;
        goto done;
    }
    if (o->interpret && (o->check || o->report)) {
        rc = usage_error(usage_run, "%s", "--interpret runs no compiled code to check or report");
        goto done;
    }
    if (o->interpret) {
        kiln_status st = kiln_interpret(g, in, out);
        if (st != KILN_OK) fprintf(stderr, "kiln: %s: %s\n", o->prog, kiln_error(g));
        rc = exit_for(st);
    } else {
        rc = run_fused(g, o, in, out);
    }
    if (!rc) rc = write_outputs(g, o, io.output_type ? &io : NULL, out);
done:
    free_tensors(in, kiln_num_inputs(g));
    free_tensors(out, nout);
    kiln_graph_free(g);
    return rc;
}

static int cmd_code(const Options *o) {
    kiln_graph *g = NULL;
    kiln_onnx_io io;
    int rc = load_program(o, &g, &io);
    if (rc) return rc;
    kiln_program *p = NULL;
    if (!(rc = compile_program(g, o, &p))) fputs(kiln_program_source(p), stdout);
    kiln_program_free(p);
    kiln_graph_free(g);
    return rc;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* time_median: the median wall time of `repeat` calls of fn after a
 * warm-up: one call, and then, when p (a compiled program) may choose its
 * team size, calls until it has timed each size (team.c), for at most
 * 0.5 s. */
typedef kiln_status (*RunFn)(void *ud);
static bool team_settled(kiln_program *p) {
    RtTeam t = rt_team(kiln_program_rt(p));
    for (int l = 0; l < t.nlevels; l++)
        if (t.nlevels > 1 && t.est[l] < 0) return false;
    return true;
}
/* The median wall time of `repeat` calls of fn, no warm-up. */
static kiln_status median_runs(RunFn fn, void *ud, int repeat, double *ms) {
    double *t = kcalloc((size_t)repeat, sizeof *t);
    if (!t) return KILN_ERR_NOMEM;
    kiln_status st = KILN_OK;
    int r = 0;
    for (; r < repeat && st == KILN_OK; r++) {
        double t0 = util_now_ms();
        st = fn(ud);
        t[r] = util_now_ms() - t0;
    }
    qsort(t, (size_t)r, sizeof t[0], cmp_double);
    *ms = r % 2 ? t[r / 2] : (t[r / 2 - 1] + t[r / 2]) / 2;
    kfree(t);
    return st;
}

static kiln_status time_median(RunFn fn, void *ud, kiln_program *p, int repeat, double *ms,
                               RtTeam *timed) {
    kiln_status st = fn(ud);
    for (double t0 = util_now_ms();
         st == KILN_OK && p && !team_settled(p) && util_now_ms() - t0 < 500;)
        st = fn(ud);
    RtTeam before = p ? rt_team(kiln_program_rt(p)) : (RtTeam){0};
    if (st == KILN_OK) st = median_runs(fn, ud, repeat, ms);
    if (timed && p) { /* the timed runs at each team size */
        *timed = rt_team(kiln_program_rt(p));
        for (int l = 0; l < timed->nlevels; l++) timed->runs[l] -= before.runs[l];
    }
    return st;
}

typedef struct {
    kiln_graph *g;
    kiln_program *p;
    const kiln_tensor *in;
    kiln_tensor *out;
    int nout;
} BenchRun;

static kiln_status bench_interp(void *ud) {
    BenchRun *b = ud;
    for (int i = 0; i < b->nout; i++) kiln_tensor_free(&b->out[i]);
    return kiln_interpret(b->g, b->in, b->out);
}

/* Compiled runs write into outputs allocated once (kiln_program_run_into),
 * as a serving loop would: fresh output memory would time its page faults. */
static kiln_status bench_compiled(void *ud) {
    BenchRun *b = ud;
    kiln_status st = kiln_program_run_into(b->p, b->in, b->out);
    if (st != KILN_OK) fprintf(stderr, "kiln: %s\n", kiln_program_error(b->p));
    return st;
}

typedef struct {
    double interp_ms, unfused_ms, fused_ms, compile_ms;
    int64_t bytes_unfused, bytes_fused;
    int threads;
    RtTeam team; /* the fused program's; runs: its timed runs at each size */
} BenchReport;

/* The process's peak resident memory (Linux's VmHWM, KiB), or -1: measured,
 * where the report's peak_memory_bytes is what the planner planned. */
static long long peak_rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kib = strtoll(line + 6, NULL, 10);
    if (f) fclose(f);
    return kib;
}

static void bench_report_fn(FILE *f, void *ud) {
    const BenchReport *r = ud;
    fprintf(f,
            ",\n \"fused_ms\": %.4f, \"unfused_ms\": %.4f, \"interp_ms\": %.4f, "
            "\"compile_ms\": %.3f, \"bytes_fused\": %lld, \"bytes_unfused\": %lld, "
            "\"threads\": %d, \"peak_rss_kib\": %lld",
            r->fused_ms, r->unfused_ms, r->interp_ms, r->compile_ms, (long long)r->bytes_fused,
            (long long)r->bytes_unfused, r->threads, peak_rss_kib());
}

static void bench_row(const char *what, double ms, int64_t bytes) {
    printf("%-26s %12.3f %14lld %10.2f\n", what, ms, (long long)bytes, (double)bytes / (ms * 1e6));
}

/* Which team sizes the fused runs used, and what each measured. */
static void print_team(const RtTeam *t) {
    if (t->nlevels < 2) return;
    int64_t all = 0;
    for (int l = 0; l < t->nlevels; l++) all += t->runs[l];
    printf("team:");
    for (int l = 0; l < t->nlevels; l++) {
        printf("%s %d thread%s", l ? "," : "", t->size[l], t->size[l] == 1 ? "" : "s");
        if (t->est[l] >= 0) printf(" %.3f ms", t->est[l]);
        printf(" (%lld of %lld runs)", (long long)t->runs[l], (long long)all);
    }
    printf("\n");
}

static void print_bench(const Options *o, const BenchReport *r, int repeat, bool hit) {
    printf("program: %s\nthreads: %d, median of %d runs after a warm-up\n", o->prog, r->threads,
           repeat);
    printf("compile: %.1f ms%s\n", r->compile_ms, hit ? " (cache hit: no compiler ran)" : "");
    print_team(&r->team);
    printf("\n");
    printf("%-26s %12s %14s %10s\n", "", "time (ms)", "bytes moved", "GB/s");
    if (!o->fused_only) {
        bench_row("interpreter (1 thread)", r->interp_ms, r->bytes_unfused);
        bench_row("unfused (a kernel per op)", r->unfused_ms, r->bytes_unfused);
    }
    bench_row("fused", r->fused_ms, r->bytes_fused);
    if (o->fused_only) return;
    printf("\nspeedup over unfused kernels: %.2fx   traffic: %.2fx less\n",
           r->unfused_ms / r->fused_ms,
           r->bytes_fused ? (double)r->bytes_unfused / (double)r->bytes_fused : 0.0);
}

static void trace_file_fn(FILE *f, void *ud) { prof_trace(ud, f); }

/* --profile: repeat more fused runs with the profiler on (after one run
 * it forgets), their median beside the plain one, then the profile. */
static int bench_profile(const Options *o, BenchRun *b, double plain_ms, int repeat) {
    RtProgram *rp = kiln_program_rt(b->p);
    if (rt_set_profile(rp, true, o->trace != NULL) != KILN_OK) {
        fprintf(stderr, "kiln: out of memory for the profiler\n");
        return EXIT_NOMEM;
    }
    RtProf *pr = rt_profile(rp);
    kiln_status st = bench_compiled(b);
    rt_reset_profile(rp);
    double ms = 0;
    if (st == KILN_OK) st = median_runs(bench_compiled, b, repeat, &ms);
    int rc = exit_for(st);
    if (!rc) {
        printf("\nprofiled: median %.3f ms against %.3f ms unprofiled (%+.1f%%: the profiler's "
               "overhead, and noise), %d runs\n",
               ms, plain_ms, 100 * (ms / plain_ms - 1), repeat);
        rt_print_profile(rp, stdout, "");
        if (o->trace) rc = write_file_atomic(o->trace, trace_file_fn, pr);
    }
    rt_set_profile(rp, false, false);
    return rc;
}

/* Compile unfused and fused, then time the interpreter and both. */
static int bench_all(const Options *o, BenchRun *b, BenchReport *r, int repeat, bool *hit) {
    kiln_program *unfused = NULL;
    kiln_options k = compile_options(o, false);
    kiln_status st = o->fused_only ? KILN_OK : kiln_compile_with(b->g, &k, &unfused);
    if (st != KILN_OK) {
        fprintf(stderr, "kiln: %s: %s\n", o->prog, kiln_error(b->g));
        return exit_for(st);
    }
    const RtStats *fs = rt_stats(kiln_program_rt(b->p));
    const Schedule *s = rt_schedule(kiln_program_rt(b->p));
    *r = (BenchReport){
        0, 0, 0, fs->compile_ms, s->unfused_bytes, s->fused_bytes, kiln_program_threads(b->p), {0}};
    *hit = fs->cache_hit;
    kiln_program *fused = b->p;
    st = time_median(bench_compiled, b, fused, repeat, &r->fused_ms, &r->team);
    b->p = unfused;
    if (st == KILN_OK && unfused)
        st = time_median(bench_compiled, b, unfused, repeat, &r->unfused_ms, NULL);
    b->p = fused;
    kiln_program_free(unfused);
    if (st == KILN_OK && !o->fused_only)
        st = time_median(bench_interp, b, NULL, repeat > 3 ? 3 : repeat, &r->interp_ms, NULL);
    if (st != KILN_OK) return exit_for(st);
    return 0;
}

static int cmd_bench(const Options *o) {
    kiln_graph *g = NULL;
    kiln_onnx_io io;
    int rc = load_program(o, &g, &io);
    if (rc) return rc;
    int nout = kiln_num_outputs(g), nin = kiln_num_inputs(g), repeat = o->repeat ? o->repeat : 10;
    BenchRun b = {g, NULL, NULL, kcalloc((size_t)(nout ? nout : 1), sizeof(kiln_tensor)), nout};
    kiln_tensor *in = NULL;
    BenchReport r;
    bool hit = false;
    if (!b.out) {
        rc = EXIT_NOMEM;
        goto done;
    }
    if ((rc = load_inputs(g, o, &io, &in)) || (rc = compile_program(g, o, &b.p))) goto done;
    b.in = in;
    for (int i = 0; i < nout; i++) {
        b.out[i] = kiln_output_desc(g, i);
        if (kiln_tensor_alloc(&b.out[i]) != KILN_OK) {
            rc = EXIT_NOMEM;
            goto done;
        }
    }
    if (o->fused_only) { /* as a deployment would: the program alone from here (peak memory) */
        kiln_graph_free(g);
        g = b.g = NULL;
    }
    if ((rc = bench_all(o, &b, &r, repeat, &hit))) goto done;
    print_bench(o, &r, repeat, hit);
    if (o->profile && (rc = bench_profile(o, &b, r.fused_ms, repeat))) goto done;
    if (o->report) {
        JsonArgs a = {rt_schedule(kiln_program_rt(b.p)), {bench_report_fn, &r}};
        rc = write_file_atomic(o->report, json_fn, &a);
    }
done:
    free_tensors(in, g ? kiln_num_inputs(g) : nin);
    free_tensors(b.out, nout);
    kiln_program_free(b.p);
    kiln_graph_free(g);
    return rc;
}

/* Parse, decompose, lower and schedule: what explain and dot show. */
static int load_plan(const Options *o, kiln_graph **g, Plan **plan) {
    const char *path = o->prog;
    kiln_onnx_io io;
    int rc = load_program(o, g, &io);
    if (rc) return rc;
    char err[1024];
    kiln_options k = compile_options(o, true);
    KilnConfig cfg = rt_config(&k);
    kiln_status st = plan_build(*g, &cfg, plan, err, sizeof err);
    if (st != KILN_OK) {
        fprintf(stderr, "kiln: %s: %s\n", path, err);
        kiln_graph_free(*g);
        return exit_for(st);
    }
    return 0;
}

/* Write a file under a temporary name and rename it into place, so a
 * failure leaves nothing behind. fn writes the contents. */
static int write_file_atomic(const char *path, void (*fn)(FILE *, void *), void *ud) {
    if (util_write_file(path, fn, ud)) return 0;
    fprintf(stderr, "kiln: cannot write %s: %s\n", path, strerror(errno));
    return EXIT_ENV;
}

static void dot_fn(FILE *f, void *ud) { report_dot(f, ud); }

/* The sub-programs of a plan's calls (control flow), each explained in
 * full after its caller, named by the path of calls that leads to it. */
static int explain_subs(const Plan *plan, const KilnConfig *cfg, const char *path) {
    const LoopProgram *lp = plan->prog;
    for (int b = 0; b < lp->nbufs; b++) {
        const GraphCall *c = lp->bufs[b]->call;
        for (int k = 0; c && k < 2; k++) {
            char name[1024], err[1024];
            graph_call_name(name, sizeof name, path, c, k);
            if (c->refused[k])
                printf("\n==== sub-program: %s: not imported at these shapes (a run that takes "
                       "it fails): %s ====\n",
                       name, c->refused[k]);
            if (!c->body[k]) continue;
            Plan *sub = NULL;
            kiln_status st = plan_build(c->body[k], cfg, &sub, err, sizeof err);
            if (st != KILN_OK) {
                fprintf(stderr, "kiln: %s: %s\n", name, err);
                return exit_for(st);
            }
            printf("\n==== sub-program: %s (computes %s; %d kernel%s) ====\n", name,
                   lp->bufs[b]->name, sub->sched->nkernels, sub->sched->nkernels == 1 ? "" : "s");
            report_explain(stdout, sub->sched);
            int rc = explain_subs(sub, cfg, name);
            plan_free(sub);
            if (rc) return rc;
        }
    }
    return 0;
}

static int cmd_explain(const Options *o) {
    kiln_graph *g = NULL;
    Plan *plan = NULL;
    int rc = load_plan(o, &g, &plan);
    if (rc) return rc;
    report_explain(stdout, plan->sched);
    kiln_options k = compile_options(o, true);
    KilnConfig cfg = rt_config(&k);
    rc = explain_subs(plan, &cfg, "");
    if (rc) {
        plan_free(plan);
        kiln_graph_free(g);
        return rc;
    }
    JsonArgs a = {plan->sched, {NULL, NULL}};
    if (o->report) rc = write_file_atomic(o->report, json_fn, &a);
    plan_free(plan);
    kiln_graph_free(g);
    return rc;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* Render a .dot file with Graphviz into path (format from its suffix). */
static int render_dot(const char *dotfile, const char *path) {
    const char *fmt = ends_with(path, ".svg") ? "svg" : "png";
    if (system("command -v dot >/dev/null 2>&1") != 0) {
        fprintf(stderr, "kiln: rendering %s needs Graphviz's dot: apt-get install -y graphviz\n",
                path);
        return EXIT_ENV;
    }
    char tmp[4200], cmd[9000];
    util_fmt(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    util_fmt(cmd, sizeof cmd, "dot -T%s -o '%s' '%s'", fmt, tmp, dotfile);
    if (strchr(path, '\'') || system(cmd) != 0 || rename(tmp, path) != 0) {
        fprintf(stderr, "kiln: dot could not render %s\n", path);
        remove(tmp);
        return EXIT_ENV;
    }
    return 0;
}

static int cmd_dot(const Options *o) {
    kiln_graph *g = NULL;
    Plan *plan = NULL;
    int rc = load_plan(o, &g, &plan);
    if (rc) return rc;
    const char *out = o->outdir;
    if (!out) {
        report_dot(stdout, plan->sched);
    } else if (ends_with(out, ".svg") || ends_with(out, ".png")) {
        char dotfile[4200];
        util_fmt(dotfile, sizeof dotfile, "%s.dot.tmp.%d", out, (int)getpid());
        rc = write_file_atomic(dotfile, dot_fn, plan->sched);
        if (!rc) rc = render_dot(dotfile, out);
        remove(dotfile);
    } else {
        rc = write_file_atomic(out, dot_fn, plan->sched);
    }
    plan_free(plan);
    kiln_graph_free(g);
    return rc;
}

/* ---- onnx-test: the ONNX backend conformance tests --------------------------- */

typedef struct {
    int pass, fail, unsupported;
} Tally;

static int cmp_cstr(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void onnx_test_one(const char *dir, const char *label, const kiln_options *k, bool interp,
                          bool verbose, Tally *t) {
    char why[2048] = "";
    OxTestVerdict v = ox_run_test(dir, k, interp, why, sizeof why);
    if (v == OXT_PASS) t->pass++;
    if (v == OXT_FAIL) t->fail++;
    if (v == OXT_UNSUPPORTED) t->unsupported++;
    if (v == OXT_FAIL) printf("FAIL %s: %s\n", label, why);
    if (v == OXT_UNSUPPORTED && verbose) printf("UNSUPPORTED %s: %s\n", label, why);
    if (v == OXT_PASS && verbose) printf("PASS %s\n", label);
    fflush(stdout);
}

/* A test directory, or a folder of them (run in name order). */
static void onnx_test_dir(const char *dir, const kiln_options *k, bool interp, bool verbose,
                          Tally *t) {
    char model[4200];
    util_fmt(model, sizeof model, "%s/model.onnx", dir);
    if (access(model, R_OK) == 0) {
        onnx_test_one(dir, dir, k, interp, verbose, t);
        return;
    }
    DIR *d = opendir(dir);
    if (!d) {
        printf("FAIL %s: cannot open: %s\n", dir, strerror(errno));
        t->fail++;
        return;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) {
            char **nn = krealloc(names, sizeof *names * (cap = cap ? cap * 2 : 64));
            if (!nn) break;
            names = nn;
        }
        names[n++] = kstrdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_cstr);
    const char *base = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;
    for (size_t i = 0; i < n; i++) {
        char sub[4200], label[4200];
        util_fmt(sub, sizeof sub, "%s/%s", dir, names[i]);
        util_fmt(label, sizeof label, "%s/%s", base, names[i]);
        if (names[i]) onnx_test_one(sub, label, k, interp, verbose, t);
        kfree(names[i]);
    }
    kfree(names);
}

static int cmd_onnx_test(int argc, char **argv) {
    bool verbose = false, interp = false;
    kiln_options k = kiln_default_options();
    int first = argc;
    for (int i = 0; i < argc && first == argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(usage_onnx_test, stdout);
            return 0;
        } else if (!strcmp(argv[i], "-v")) {
            verbose = true;
        } else if (!strcmp(argv[i], "--interpret")) {
            interp = true;
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            if (!parse_count(argv[++i], 1, 1024, &k.threads))
                return usage_error(usage_onnx_test, "--threads needs a count, got '%s'", argv[i]);
        } else if (!strcmp(argv[i], "--target") && i + 1 < argc) {
            k.target = argv[++i];
        } else if (argv[i][0] == '-') {
            return usage_error(usage_onnx_test, "unknown option '%s'", argv[i]);
        } else {
            first = i;
        }
    }
    if (first == argc) return usage_error(usage_onnx_test, "%s", "no test directory given");
    int rc = enter_target(k.target);
    if (rc) return rc;
    Tally all = {0};
    for (int i = first; i < argc; i++) {
        Tally t = {0};
        onnx_test_dir(argv[i], &k, interp, verbose, &t);
        printf("== %s: %d passed, %d failed, %d unsupported (of %d)\n", argv[i], t.pass, t.fail,
               t.unsupported, t.pass + t.fail + t.unsupported);
        all.pass += t.pass, all.fail += t.fail, all.unsupported += t.unsupported;
    }
    printf("== total: %d passed, %d failed, %d unsupported\n", all.pass, all.fail, all.unsupported);
    return all.fail ? EXIT_INPUT : 0;
}

/* After an out-of-memory error: the budget the allocation ran into. */
static void nomem_note(void) {
    double b = (double)util_mem_budget();
    const char *unit = "MiB";
    b /= 1024.0 * 1024.0;
    if (b >= 1024) {
        b /= 1024;
        unit = "GiB";
    }
    fprintf(stderr,
            "kiln: note: kiln holds at most %.1f %s (physical memory plus swap, "
            "or $KILN_MEM_LIMIT)\n",
            b, unit);
}

/* The target tier (--target, else $KILN_TARGET, else the best this CPU
 * runs), checked before anything compiles: an unknown name is bad usage
 * (2), a tier this CPU cannot run an environment failure (3). The library
 * kernels of this thread follow it from here on (explain's "runs on"). */
static int enter_target(const char *name) {
    Target t;
    char err[512];
    kiln_status st = tgt_resolve(name, &t, err, sizeof err);
    if (st != KILN_OK) {
        fprintf(stderr, "kiln: %s\n", err);
        return st == KILN_ERR_INPUT ? EXIT_USAGE : exit_for(st);
    }
    ext_isa_enter(t.ext);
    return 0;
}

static const Command commands[] = {
    {"run", cmd_run, &usage_run,
     OPT_INPUTS | OPT_SEED | OPT_OUT | OPT_THREADS | OPT_CHECK | OPT_INTERPRET | OPT_REPORT |
         OPT_NOFUSE | OPT_NOEPILOGUE | OPT_SHAPE | OPT_TARGET},
    {"code", cmd_code, &usage_code, OPT_NOFUSE | OPT_NOEPILOGUE | OPT_SHAPE | OPT_TARGET},
    {"bench", cmd_bench, &usage_bench,
     OPT_INPUTS | OPT_SEED | OPT_THREADS | OPT_REPEAT | OPT_REPORT | OPT_NOEPILOGUE | OPT_SHAPE |
         OPT_TARGET | OPT_FIXED | OPT_PROFILE | OPT_TRACE | OPT_FUSED_ONLY},
    {"explain", cmd_explain, &usage_explain,
     OPT_REPORT | OPT_NOFUSE | OPT_NOEPILOGUE | OPT_SHAPE | OPT_TARGET},
    {"dot", cmd_dot, &usage_dot, OPT_OUT | OPT_SHAPE | OPT_TARGET},
};

static const Command *find_command(const char *name) {
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(commands[i].name, name)) return &commands[i];
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs(usage_main, stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        if (argc > 2 && !strcmp(argv[2], "onnx-test")) {
            fputs(usage_onnx_test, stdout);
            return 0;
        }
        if (argc > 2 && find_command(argv[2])) {
            fputs(*find_command(argv[2])->usage, stdout);
            return 0;
        }
        if (argc > 2) return usage_error(usage_main, "unknown command '%s'", argv[2]);
        fputs(usage_main, stdout);
        return 0;
    }
    if (!strcmp(cmd, "onnx-test")) return cmd_onnx_test(argc - 2, argv + 2);
    const Command *c = find_command(cmd);
    if (!c) return usage_error(usage_main, "unknown command '%s'", cmd);
    Options o;
    int rc = parse_args(c, argc - 2, argv + 2, &o);
    if (rc) return rc < 0 ? 0 : rc;
    if ((rc = enter_target(o.target))) return rc;
    bool profile;
    const char *trace;
    char err[256];
    kiln_status est = rt_env_profile(&profile, &trace, err, sizeof err);
    if (est != KILN_OK) {
        fprintf(stderr, "kiln: %s\n", err);
        return est == KILN_ERR_INPUT ? EXIT_USAGE : exit_for(est);
    }
    rc = c->run(&o);
    if (rc == EXIT_NOMEM) nomem_note();
    return rc;
}
