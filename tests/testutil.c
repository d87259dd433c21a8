/* testutil.c -- helpers several test files share: reading a file,
 * compiling generated C with the vectorization report, dense views. */
#include "test.h"
#include "testutil.h"
#include "runtime/runtime.h"

char *test_read_text(const char *path) {
    char *buf = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (n >= 0 && (buf = malloc((size_t)n + 1))) {
        size_t got = fread(buf, 1, (size_t)n, f);
        buf[got] = 0;
    }
    fclose(f);
    return buf;
}

const char *test_cc_override;

const char *test_tier_flags(int tier) {
    static char flags[TGT_COUNT][160];
    Target t;
    char err[256];
    /* as if this CPU had every feature the tier needs: only compiled */
    if (tier < 0 || tier >= TGT_COUNT) return "";
    if (!flags[tier][0] &&
        tgt_make((TargetTier)tier, tgt_tier_needs((TargetTier)tier) | tgt_cpu_features(), &t, err,
                 sizeof err) == KILN_OK)
        snprintf(flags[tier], sizeof flags[tier], "%s", t.flags);
    return flags[tier];
}

int test_compile_report(const char *name, const char *source, char c[600], char o[600],
                        char **report) {
    return test_compile_report_with(name, source, kiln_config_default().target.flags, c, o, report);
}

int test_compile_report_with(const char *name, const char *source, const char *flags, char c[600],
                             char o[600], char **report) {
    char log[600], cmd[3000];
    snprintf(c, 600, "%s/%s.c", test_tmpdir(), name);
    snprintf(o, 600, "%s/%s.o", test_tmpdir(), name);
    snprintf(log, sizeof log, "%s/%s.log", test_tmpdir(), name);
    FILE *f = fopen(c, "w");
    if (!f) return -1;
    fputs(source, f);
    fclose(f);
    const char *cc = test_cc_override ? test_cc_override : getenv("CC") ? getenv("CC") : "cc";
    /* the JIT's own flags for GCC (jit.c adds them where cc is GCC) */
    const char *gcc = strstr(cc, "clang") ? "" : CG_GCC_FLAGS;
    snprintf(cmd, sizeof cmd,
             "%s -std=c11 -O3 %s -fopenmp -fPIC %s %s -fopt-info-optimized -c '%s' "
             "-o '%s' > '%s' 2>&1",
             cc, flags, CG_EXTRA_FLAGS, gcc, c, o, log);
    if (system(cmd) != 0) return -1;
    *report = test_read_text(log);
    return *report ? 0 : -1;
}

bool test_vectorized_at(const char *report, const char *file, int line, bool allow_libcall) {
    char pat[700];
    for (int l = line - 1; l <= line + 1; l++) {
        snprintf(pat, sizeof pat, "%s:%d:", file, l);
        for (const char *p = strstr(report, pat); p; p = strstr(p + 1, pat)) {
            if (p != report && p[-1] != '\n') continue;
            const char *eol = strchr(p, '\n');
            const char *hit = strstr(p, "optimized: loop vectorized");
            const char *lib =
                allow_libcall ? strstr(p, "split to 0 loops and 1 library calls") : NULL;
            if ((hit && (!eol || hit < eol)) || (lib && (!eol || lib < eol))) return true;
        }
    }
    return false;
}

ExtView test_dense_view(int rank, const int64_t *shape) {
    ExtView v = {rank, {0}, {0}, 0};
    int64_t s = 1;
    for (int d = rank - 1; d >= 0; d--) {
        v.shape[d] = shape[d];
        v.stride[d] = s;
        s *= shape[d];
    }
    return v;
}

kiln_value test_prog_input(TestProg *P, const char *name, int rank, const int64_t *shape,
                           uint64_t seed_base) {
    kiln_tensor *t = &P->in[P->nin];
    kiln_value v = kiln_input(P->g, name, KILN_F32, rank, shape);
    if (v < 0) return v;
    *t = kiln_input_desc(P->g, P->nin);
    if (kiln_tensor_alloc(t) != KILN_OK) return KILN_NONE;
    kiln_fill_randn(t->data, kiln_tensor_numel(t), seed_base + (uint64_t)P->nin);
    P->nin++;
    return v;
}

void test_prog_free(TestProg *P) {
    int nout = kiln_num_outputs(P->g);
    for (int i = 0; i < P->nin; i++) kiln_tensor_free(&P->in[i]);
    for (int i = 0; P->p && i < nout; i++) {
        kiln_tensor_free(&P->got[i]);
        kiln_tensor_free(&P->want[i]);
    }
    kiln_program_free(P->p);
    kiln_graph_free(P->g);
}

kiln_value test_random_weight(kiln_graph *g, const char *name, int rank, const int64_t *shape,
                              uint64_t seed) {
    int64_t n = 1;
    for (int d = 0; d < rank; d++) n *= shape[d];
    float *data = malloc(sizeof(float) * (size_t)n);
    if (!data) return KILN_NONE;
    kiln_fill_randn(data, n, seed);
    kiln_value v = kiln_weight(g, name, rank, shape, data);
    free(data);
    return v;
}

kiln_status test_compile_in_cache(kiln_graph *g, const char *cache, const kiln_options *o,
                                  kiln_program **p) {
    char dir[600], saved[1024];
    const char *old = getenv("KILN_CACHE_DIR");
    if (old) snprintf(saved, sizeof saved, "%s", old);
    snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), cache);
    setenv("KILN_CACHE_DIR", dir, 1);
    kiln_options d = kiln_default_options();
    kiln_status st = kiln_compile_with(g, o ? o : &d, p);
    if (old)
        setenv("KILN_CACHE_DIR", saved, 1);
    else
        unsetenv("KILN_CACHE_DIR");
    return st;
}

bool test_prog_check(TestProg *P, const char *cache, const kiln_options *o, const char *exact) {
    if (test_compile_in_cache(P->g, cache, o, &P->p) != KILN_OK) {
        test_failf(__FILE__, __LINE__, "compile: %s", kiln_error(P->g));
        return false;
    }
    if (kiln_program_run(P->p, P->in, P->got) != KILN_OK) {
        test_failf(__FILE__, __LINE__, "run: %s", kiln_program_error(P->p));
        kiln_program_free(P->p);
        P->p = NULL;
        return false;
    }
    if (kiln_interpret(P->g, P->in, P->want) != KILN_OK) {
        test_failf(__FILE__, __LINE__, "interpret: %s", kiln_error(P->g));
        return false;
    }
    RtTolerance tol = rt_tolerance(rt_graph(kiln_program_rt(P->p)));
    for (int i = 0; i < kiln_num_outputs(P->g); i++) {
        const char *name = kiln_output_name(P->g, i);
        const float *g = P->got[i].data, *w = P->want[i].data;
        int64_t n = kiln_tensor_numel(&P->want[i]);
        bool bits = exact && strstr(exact, name);
        EXPECT(kiln_tensor_numel(&P->got[i]) == n, "%s: size", name);
        for (int64_t k = 0; k < n; k++)
            if (bits ? g[k] != w[k] : !(rt_excess(g[k], w[k], tol) <= 1.0)) {
                test_failf(__FILE__, __LINE__, "%s[%lld]: fused %.8g, interpreter %.8g", name,
                           (long long)k, g[k], w[k]);
                break;
            }
    }
    return !test_failed;
}

void test_use_shared_cache(void) {
    const char *shared = getenv("KILN_TEST_CACHE_DIR");
    char dir[600];
    snprintf(dir, sizeof dir, "%s/cache", test_tmpdir());
    setenv("KILN_CACHE_DIR", shared ? shared : dir, 1);
}
