/*
 * test_jit.c -- the JIT and its cache (src/runtime/jit.c).
 *
 * Every test points KILN_CACHE_DIR at a fresh directory of its own and
 * restores the environment (CC, KILN_CACHE_DIR) afterwards. Whether the
 * compiler ran is observed from outside: CC is a shell script that logs
 * each compile to a file before exec'ing the real cc. The SHA-256 behind
 * the cache key is checked against coreutils' sha256sum.
 */
#include "test.h"
#include "runtime/runtime.h"
#include "testing.h" /* test hooks */
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *src_inc = "int f(int x) { return x + 1; }\n";

/* ---- environment ------------------------------------------------------ */

static char saved_cc[1024], saved_cache[1024];
static int had_cc, had_cache;

static void save_env(void) {
    const char *cc = getenv("CC"), *cache = getenv("KILN_CACHE_DIR");
    had_cc = cc != NULL;
    had_cache = cache != NULL;
    snprintf(saved_cc, sizeof saved_cc, "%s", cc ? cc : "");
    snprintf(saved_cache, sizeof saved_cache, "%s", cache ? cache : "");
}

static void restore_env(void) {
    if (had_cc)
        setenv("CC", saved_cc, 1);
    else
        unsetenv("CC");
    if (had_cache)
        setenv("KILN_CACHE_DIR", saved_cache, 1);
    else
        unsetenv("KILN_CACHE_DIR");
}

/* <tmp>/<name>, created empty; also the cache directory when cache. */
static const char *scratch(const char *name, int cache) {
    static char dir[512];
    char cmd[1100];
    snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), name);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    if (system(cmd) != 0) fprintf(stderr, "could not reset %s\n", dir);
    if (cache) setenv("KILN_CACHE_DIR", dir, 1);
    return dir;
}

/* Run one test body with the environment saved and restored around it. */
#define JIT_TEST(name)             \
    static void name##_body(void); \
    TEST(name) {                   \
        save_env();                \
        unsetenv("CC");            \
        name##_body();             \
        restore_env();             \
    }                              \
    static void name##_body(void)

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static int count_lines_with(const char *path, const char *needle) {
    FILE *f = fopen(path, "r");
    char line[4096];
    int n = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f)) n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* CC := a script in dir that logs each compile's arguments to log (dir/cc.log)
 * before exec'ing cc; false when it cannot be made. */
static bool logging_cc(const char *dir, char log[600]) {
    char script[600], text[1400];
    snprintf(script, sizeof script, "%s/logcc.sh", dir);
    snprintf(log, 600, "%s/cc.log", dir);
    snprintf(text, sizeof text, "#!/bin/sh\necho \"$*\" >> '%s'\nexec cc \"$@\"\n", log);
    write_file(script, text);
    if (chmod(script, 0755) != 0) return false;
    setenv("CC", script, 1);
    return true;
}

/* Compile src and return f(41) (or -1000 on a failure, with a message). */
static int compile_call(const char *src, JitStats *stats) {
    char err[8192];
    JitLib *lib;
    if (jit_compile(src, NULL, &lib, err, sizeof err, stats) != KILN_OK) {
        printf("jit_compile: %s\n", err);
        return -1000;
    }
    int (*f)(int) = (int (*)(int))jit_sym(lib, "f");
    int r = f ? f(41) : -1000;
    jit_close(lib);
    return r;
}

/* ---- tests ---------------------------------------------------------------- */

JIT_TEST(jit_compile_and_call) {
    scratch("jit_compile_and_call", 1);
    JitStats st;
    CHECK(compile_call(src_inc, &st) == 42);
    CHECK(st.cache_hit == 0 && st.compile_ms > 0);
    CHECK(file_exists(st.path) && file_exists(st.src_path));
    CHECK(strstr(st.path, test_tmpdir()) == st.path);
    const char *dot = strrchr(st.path, '.');
    CHECK(dot && strcmp(dot, ".so") == 0);
}

/* The second compile must not run the compiler: the CC script logs every
 * compile (its -o argument), and the log must hold one line after two. */
JIT_TEST(jit_cache_hit_runs_no_compiler) {
    const char *dir = scratch("jit_cache_hit", 1);
    char log[600];
    CHECK(logging_cc(dir, log));
    JitStats a, b;
    CHECK(compile_call(src_inc, &a) == 42);
    CHECK(a.cache_hit == 0 && a.compile_ms > 0);
    CHECK(compile_call(src_inc, &b) == 42);
    CHECK(b.cache_hit == 1 && b.compile_ms == 0.0);
    CHECK(strcmp(a.path, b.path) == 0);
    int runs = count_lines_with(log, " -o ");
    CHECKF(runs == 1, "compiles logged: %d", runs);
}

/* Different flags or source: a different entry. */
JIT_TEST(jit_key_covers_source_and_flags) {
    scratch("jit_key", 1);
    const char *src = "int f(int x) { return x + K; }\n";
    char err[8192];
    JitLib *l1, *l2;
    JitStats s1, s2;
    CHECKF(jit_compile(src, "-DK=1", &l1, err, sizeof err, &s1) == KILN_OK, "%s", err);
    CHECKF(jit_compile(src, "-DK=2", &l2, err, sizeof err, &s2) == KILN_OK, "%s", err);
    CHECK(!s2.cache_hit && strcmp(s1.path, s2.path) != 0);
    int (*f1)(int) = (int (*)(int))jit_sym(l1, "f");
    int (*f2)(int) = (int (*)(int))jit_sym(l2, "f");
    CHECK(f1 && f2 && f1(41) == 42 && f2(41) == 43); /* both loaded at once */
    jit_close(l1);
    jit_close(l2);
}

/* truncate_it: 0 garbage, else the entry is cut to that many bytes (a
 * fraction of its size when below 1: dlopen maps a file cut mid-way and
 * faults with SIGBUS on the missing pages, so the loader must catch it). */
static void corrupt_rebuilt(const char *name, double truncate_it) {
    scratch(name, 1);
    JitStats a, b;
    CHECK(compile_call(src_inc, &a) == 42);
    if (truncate_it > 0) {
        struct stat st;
        CHECK(stat(a.path, &st) == 0);
        off_t to = truncate_it < 1 ? (off_t)(st.st_size * truncate_it) : (off_t)truncate_it;
        CHECK(truncate(a.path, to) == 0);
    } else {
        write_file(a.path, "this is not a shared object\n");
    }
    CHECK(compile_call(src_inc, &b) == 42);
    CHECK(b.cache_hit == 0 && b.compile_ms > 0);
    JitStats c;
    CHECK(compile_call(src_inc, &c) == 42);
    CHECK(c.cache_hit == 1);
}

JIT_TEST(jit_garbage_so_is_rebuilt) { corrupt_rebuilt("jit_garbage", 0); }
JIT_TEST(jit_truncated_so_is_rebuilt) { corrupt_rebuilt("jit_truncated", 100); }
/* Regression (found by the robustness work that added the fuzzers): a .so
 * cut after its program headers was a SIGBUS. */
JIT_TEST(jit_half_so_is_rebuilt) { corrupt_rebuilt("jit_half", 0.5); }
JIT_TEST(jit_nearly_whole_so_is_rebuilt) { corrupt_rebuilt("jit_nearly_whole", 0.95); }

/* An ELF file that loads but lacks the marker (another key's object). */
JIT_TEST(jit_wrong_marker_is_rebuilt) {
    scratch("jit_marker", 1);
    JitStats a, b;
    CHECK(compile_call("int f(int x) { return x + 2; }\n", &a) == 43);
    CHECK(compile_call(src_inc, &b) == 42);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", a.path, b.path);
    CHECK(system(cmd) == 0);
    JitStats c;
    CHECK(compile_call(src_inc, &c) == 42);
    CHECK(c.cache_hit == 0);
}

JIT_TEST(jit_compile_error_reports_stderr) {
    scratch("jit_error", 1);
    char err[8192];
    JitLib *lib = (JitLib *)1;
    JitStats st;
    const char *bad = "int f(int x) { return x + ; }\n";
    kiln_status s = jit_compile(bad, NULL, &lib, err, sizeof err, &st);
    CHECK(s == KILN_ERR_ENV && lib == NULL);
    CHECKF(strstr(err, "error") != NULL, "message: %s", err);
    CHECKF(strstr(err, st.src_path) != NULL, "message lacks the source path: %s", err);
    CHECK(file_exists(st.src_path));
    CHECK(!file_exists(st.path));
}

JIT_TEST(jit_missing_compiler) {
    scratch("jit_nocc", 1);
    setenv("CC", "/nonexistent", 1);
    char err[1024];
    JitLib *lib;
    CHECK(jit_compile(src_inc, NULL, &lib, err, sizeof err, NULL) == KILN_ERR_ENV);
    CHECKF(strstr(err, "C compiler '/nonexistent' not found (set CC)") != NULL, "message: %s", err);
    setenv("CC", "kiln-no-such-cc", 1);
    CHECK(jit_compile(src_inc, NULL, &lib, err, sizeof err, NULL) == KILN_ERR_ENV);
    CHECKF(strstr(err, "'kiln-no-such-cc' not found") != NULL, "message: %s", err);
}

JIT_TEST(jit_unwritable_cache_dir) {
    const char *dir = scratch("jit_unwritable", 0);
    char file[600], cache[700], err[1024];
    snprintf(file, sizeof file, "%s/file", dir);
    snprintf(cache, sizeof cache, "%s/sub", file);
    write_file(file, "a regular file\n");
    setenv("KILN_CACHE_DIR", cache, 1);
    JitLib *lib;
    CHECK(jit_compile(src_inc, NULL, &lib, err, sizeof err, NULL) == KILN_ERR_ENV);
    CHECKF(strstr(err, cache) != NULL, "message does not name the dir: %s", err);
}

/* Two processes compile the same new source at once: both succeed, the
 * cache holds exactly the .c and the .so (no temporaries), and the parent
 * then loads it from the cache. The compiler's kept `--version` text
 * (compiler-<hash>.version, see jit.c) may or may not be there, depending
 * on whether this process had already asked the compiler: it is not
 * counted, but nothing else is allowed. */
JIT_TEST(jit_concurrent_processes) {
    const char *dir = scratch("jit_concurrent", 1);
    const char *src = "int f(int x) { return x * 2; }\n";
    pid_t kids[2];
    for (int i = 0; i < 2; i++) {
        kids[i] = fork();
        CHECK(kids[i] >= 0);
        if (kids[i] == 0) _exit(compile_call(src, NULL) == 82 ? 0 : 1);
    }
    for (int i = 0; i < 2; i++) {
        int status;
        CHECK(waitpid(kids[i], &status, 0) == kids[i]);
        CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d failed", i);
    }
    JitStats st;
    CHECK(compile_call(src, &st) == 82);
    CHECK(st.cache_hit == 1);
    char cmd[700];
    snprintf(cmd, sizeof cmd,
             "test $(ls -A '%s' | grep -v '^compiler-[0-9a-f]*\\.version$' | wc -l) -eq 2"
             " && test $(ls -A '%s' | grep -c '\\.c$') -eq 1"
             " && test $(ls -A '%s' | grep -c '\\.so$') -eq 1",
             dir, dir, dir);
    CHECKF(system(cmd) == 0,
           "cache dir holds more than the .c, the .so (and the compiler version)");
}

/* A kernel as the code generator will write it: vecmath.h, OpenMP, and a
 * loop the compiler vectorizes; checked against libm. */
JIT_TEST(jit_vecmath_openmp_kernel) {
    scratch("jit_kernel", 1);
    const char *src = "#include \"codegen/vecmath.h\"\n"
                      "void kern(const float *restrict x, float *restrict y, long n) {\n"
                      "#pragma omp parallel for\n"
                      "    for (long i = 0; i < n; i++) y[i] = kiln_expf(x[i]) + kiln_sinf(x[i]);\n"
                      "}\n";
    char flags[600], err[8192];
    snprintf(flags, sizeof flags, "-I%s/../src", test_srcdir());
    JitLib *lib;
    CHECKF(jit_compile(src, flags, &lib, err, sizeof err, NULL) == KILN_OK, "%s", err);
    void (*kern)(const float *, float *, long) =
        (void (*)(const float *, float *, long))jit_sym(lib, "kern");
    CHECK(kern != NULL);
    enum { N = 1000 };
    static float x[N], y[N];
    for (int i = 0; i < N; i++) x[i] = (float)(i - 500) * 0.02f;
    kern(x, y, N);
    for (int i = 0; i < N; i++) {
        double ref = exp((double)x[i]) + sin((double)x[i]);
        EXPECT(fabs(y[i] - ref) <= 1e-6 * fabs(ref) + 1e-6, "x=%g y=%g ref=%g", x[i], y[i], ref);
    }
    jit_close(lib);
}

/* An allocator that refuses the n-th request (counting from 0). */
static long alloc_count, alloc_fail_at;

static void *failing_alloc(void *ud, void *ptr, size_t oldsize, size_t newsize) {
    (void)ud, (void)oldsize;
    if (newsize == 0) {
        free(ptr);
        return NULL;
    }
    if (alloc_count++ == alloc_fail_at) return NULL;
    return realloc(ptr, newsize);
}

/* Every allocation in jit_compile may fail: each gives KILN_ERR_NOMEM (or
 * succeeds) and leaks nothing (ASan checks); a fresh cache each round
 * keeps it on the compile path. */
JIT_TEST(jit_out_of_memory) {
    const char *dir = scratch("jit_oom", 0);
    char cache[700], err[8192];
    kiln_status st = KILN_ERR_NOMEM;
    for (alloc_fail_at = 0; st == KILN_ERR_NOMEM && alloc_fail_at < 200; alloc_fail_at++) {
        snprintf(cache, sizeof cache, "%s/c%ld", dir, alloc_fail_at);
        setenv("KILN_CACHE_DIR", cache, 1);
        JitLib *lib = NULL;
        alloc_count = 0;
        kiln_set_allocator(failing_alloc, NULL);
        st = jit_compile(src_inc, "-DUNUSED=1", &lib, err, sizeof err, NULL);
        kiln_set_allocator(NULL, NULL);
        CHECKF(st == KILN_OK || st == KILN_ERR_NOMEM, "status %d: %s", st, err);
        CHECK((st == KILN_OK) == (lib != NULL));
        jit_close(lib);
    }
    CHECKF(st == KILN_OK && alloc_fail_at > 1, "%ld rounds", alloc_fail_at);
    printf("jit: %ld allocations, each refused once\n", alloc_fail_at - 1);
}

/* SHA-256 against sha256sum for lengths around every block boundary. */
TEST(jit_sha256_matches_sha256sum) {
    if (system("command -v sha256sum >/dev/null 2>&1") != 0) {
        printf("jit: no sha256sum, skipped\n");
        return;
    }
    char path[600], cmd[700], want[65], got[65];
    static char data[300];
    snprintf(path, sizeof path, "%s/sha_input", test_tmpdir());
    for (int n = 0; n < 300; n += (n < 130 ? 1 : 37)) {
        for (int i = 0; i < n; i++) data[i] = (char)('a' + (i * 7 + n) % 26);
        FILE *f = fopen(path, "wb");
        CHECK(f && fwrite(data, 1, (size_t)n, f) == (size_t)n && fclose(f) == 0);
        snprintf(cmd, sizeof cmd, "sha256sum '%s'", path);
        FILE *p = popen(cmd, "r");
        CHECK(p && fscanf(p, "%64s", want) == 1);
        pclose(p);
        jit_sha256_hex(data, (size_t)n, got);
        CHECKF(strcmp(got, want) == 0, "length %d: %s != %s", n, got, want);
    }
    jit_sha256_hex("abc", 3, got);
    CHECK(strcmp(got, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad") == 0);
}

/* ---- a large program in two translation units ------------------------------ */

/* A program with parallel kernels, a matmul with its epilogue and a
 * reduction, every kernel split from the others by the forced split. */
static const char *split_src = "input x: f32[256, 512]\n"
                               "weight w: f32[512, 128] = randn(3)\n"
                               "y = relu(x @ w + 1)\n"
                               "z = sum(exp(y * 0.25), 1)\n"
                               "s = tanh(x) + sigmoid(x)\n"
                               "output z, s\n";

/* With the split forced (every size): the compiler runs three times (two
 * units at once with KILN_PART 1 and 2, then the link), the program gives
 * the interpreter's answer, and the profiler's pointer, one variable for
 * both units, reaches every parallel kernel's threads. */
JIT_TEST(jit_split_two_units) {
    const char *dir = scratch("jit_split", 1);
    char log[600];
    CHECK(logging_cc(dir, log));
    jit_set_split_min(1);
    kiln_graph *g = kiln_graph_new();
    CHECKF(kiln_parse(g, split_src, "split.kiln") == KILN_OK, "%s", kiln_error(g));
    kiln_options o = kiln_default_options();
    o.threads = 2;
    o.fixed_threads = 1;
    kiln_program *p = NULL;
    kiln_status st = kiln_compile_with(g, &o, &p);
    jit_set_split_min(0);
    CHECKF(st == KILN_OK, "%s", kiln_error(g));
    RtProgram *rp = kiln_program_rt(p);
    EXPECT(rt_stats(rp)->jit_units == 2, "units %d", rt_stats(rp)->jit_units);
    EXPECT(count_lines_with(log, "-DKILN_PART=1 -c") == 1 &&
               count_lines_with(log, "-DKILN_PART=2 -c") == 1 && count_lines_with(log, " -o ") == 3,
           "compiler runs:\n%s", log);
    CHECK(rt_set_profile(rp, true, false) == KILN_OK);
    kiln_tensor in = kiln_input_desc(g, 0), got[2], want[2];
    CHECK(kiln_tensor_alloc(&in) == KILN_OK);
    kiln_fill_randn(in.data, kiln_tensor_numel(&in), 5);
    CHECK(kiln_program_run(p, &in, got) == KILN_OK);
    CHECK(kiln_interpret(g, &in, want) == KILN_OK);
    for (int i = 0; i < 2; i++) {
        int64_t n = kiln_tensor_numel(&want[i]);
        double worst = 0;
        for (int64_t k = 0; k < n; k++)
            worst = fmax(worst, fabs(((float *)got[i].data)[k] - ((float *)want[i].data)[k]) /
                                    (1e-4 + fabs(((float *)want[i].data)[k])));
        EXPECT(worst < 1e-2, "output %d off the interpreter by %g (relative)", i, worst);
        kiln_tensor_free(&got[i]);
        kiln_tensor_free(&want[i]);
    }
    const CgOutput *code = rt_code(rp);
    int parallel = 0;
    for (int c = 0; c < code->ncalls; c++)
        if (code->calls[c].parallel) {
            parallel++;
            EXPECT(prof_call(rt_profile(rp), c)->busy_ns > 0,
                   "parallel call %d: no thread reported", c);
        }
    EXPECT(parallel >= 1, "no parallel kernel");
    kiln_tensor_free(&in);
    kiln_program_free(p);
    kiln_graph_free(g);
}

/* A unit the compiler fails on: the message names the kept source, and no
 * unit, object or partial .so is left in the cache directory. */
JIT_TEST(jit_split_unit_fails) {
    const char *dir = scratch("jit_split_fail", 1);
    char script[600], text[1400], cmd[1400];
    snprintf(script, sizeof script, "%s/failcc.sh", dir);
    snprintf(
        text, sizeof text,
        "#!/bin/sh\ncase \"$*\" in *KILN_PART=2*) echo 'cc: unit 2 refused' >&2; exit 1;; esac\n"
        "exec cc \"$@\"\n");
    write_file(script, text);
    CHECK(chmod(script, 0755) == 0);
    setenv("CC", script, 1);
    jit_set_split_min(1);
    kiln_graph *g = kiln_graph_new();
    CHECKF(kiln_parse(g, split_src, "split.kiln") == KILN_OK, "%s", kiln_error(g));
    kiln_program *p = NULL;
    kiln_status st = kiln_compile(g, 1, &p);
    jit_set_split_min(0);
    EXPECT(st == KILN_ERR_ENV && p == NULL, "status %d", st);
    EXPECT(strstr(kiln_error(g), "failed (exit 1)") && strstr(kiln_error(g), "(source kept)") &&
               strstr(kiln_error(g), "unit 2 refused"),
           "message: %s", kiln_error(g));
    snprintf(cmd, sizeof cmd,
             "ls '%s' | grep -v -E '^[0-9a-f]{32}\\.c$|^compiler-|\\.sh$' | grep -q .", dir);
    EXPECT(system(cmd) != 0, "files left in %s", dir);
    kiln_program_free(p);
    kiln_graph_free(g);
}
