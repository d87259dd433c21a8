/*
 * test_golden.c -- every op of the .kiln format against NumPy.
 *
 * tests/golden/gen.py (run by hand, never by make) writes one directory per
 * case under tests/golden/cases/: the program prog.kiln, one <input>.npy per
 * declared input, any file("...") weights, and expect_<output>.npy for each
 * output, computed by NumPy. This test parses each program, feeds it the
 * inputs, runs the reference interpreter and compares every output with
 * NumPy's: an oracle that shares no code with kiln.
 *
 * Tolerance. NumPy computes each case in float64 from the float32 inputs and
 * casts the result to float32 once. kiln's interpreter stores every
 * intermediate as float32 (it accumulates reductions and matmul/conv dot
 * products in double), so each op adds up to half an ulp of float32 error
 * (~6e-8 relative) and a chain of a few dozen ops stays far below 1e-5. We
 * accept |got - want| <= ATOL + RTOL * |want| with RTOL 1e-4 (about 800 ulps:
 * room for libm differences in exp/erf/pow and for error amplified through
 * a short chain) and ATOL 1e-5 (for results near zero after cancellation,
 * such as a sum of normals or sin near a root, where relative error means
 * nothing). A NaN or inf where NumPy has a finite value always fails. bool
 * outputs (comparisons) must match exactly: gen.py computes the operands of
 * a comparison in float32 like kiln does, so no result sits on a rounding
 * edge.
 *
 * All cases run in one TEST (the TEST macro registers at compile time); each
 * failing case prints "  case NAME: ..." and the test fails if any case
 * fails, or if index.txt lists fewer than MIN_CASES cases (an empty or
 * truncated data set must not pass silently). Set KILN_GOLDEN_CASE=NAME to
 * run only the cases whose names contain NAME.
 */
#include "test.h"
#include <ctype.h>
#include <dirent.h>
#include <stdarg.h>

#define ATOL 1e-5
#define RTOL 1e-4
/* f64 outputs (cases with f64 inputs): libm's and NumPy's double math
 * differ by an ulp or two, a chain by a few more; float would miss these
 * by 1e-7 and more. */
#define ATOL64 1e-12
#define RTOL64 1e-12
#define MIN_CASES 50

/* One case: its name and directory, for messages and file names. */
typedef struct {
    const char *name;
    char dir[512];
} Case;

static void case_fail(const Case *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void case_fail(const Case *c, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    printf("  case %s: ", c->name);
    /* Indent continuation lines (a parse error's source line and caret) so
     * tests/run.sh, which shows lines starting with two spaces, keeps them. */
    for (const char *p = msg; *p; p++) {
        if (*p == '\n' && !p[1]) break;
        putchar(*p);
        if (*p == '\n') fputs("    ", stdout);
    }
    putchar('\n');
    test_failed = 1;
}

/* dir/file into buf; 0 if it did not fit. */
static int path_in(char *buf, size_t len, const char *dir, const char *file) {
    int n = snprintf(buf, len, "%s/%s", dir, file);
    return n > 0 && (size_t)n < len;
}

static void shape_str(char *buf, size_t len, const kiln_tensor *t) {
    size_t off = (size_t)snprintf(buf, len, "%s[", kiln_dtype_name(t->dtype));
    for (int i = 0; i < t->rank && off < len; i++)
        off +=
            (size_t)snprintf(buf + off, len - off, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (off < len) snprintf(buf + off, len - off, "]");
}

static int same_type(const kiln_tensor *a, const kiln_tensor *b) {
    if (a->dtype != b->dtype || a->rank != b->rank) return 0;
    for (int i = 0; i < a->rank; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

/* Flat index -> "[i, j, k]" in t's shape. */
static void index_str(char *buf, size_t len, const kiln_tensor *t, int64_t flat) {
    int64_t idx[KILN_MAX_RANK];
    for (int i = t->rank - 1; i >= 0; i--) {
        idx[i] = t->shape[i] ? flat % t->shape[i] : 0;
        flat = t->shape[i] ? flat / t->shape[i] : 0;
    }
    size_t off = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < t->rank && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%s%lld", i ? ", " : "", (long long)idx[i]);
    if (off < len) snprintf(buf + off, len - off, "]");
}

/* How far outside the tolerance got is (> 1: a failure). */
static double excess(float got, float want) {
    if (!isfinite(want)) /* NaN matches NaN, inf the same inf */
        return (isnan(want) ? isnan(got) : got == want) ? 0.0 : INFINITY;
    if (!isfinite(got)) return INFINITY;
    return fabs((double)got - (double)want) / (ATOL + RTOL * fabs((double)want));
}

/* The same for an f64 output, at double precision. */
static double excess64(double got, double want) {
    if (!isfinite(want)) return (isnan(want) ? isnan(got) : got == want) ? 0.0 : INFINITY;
    if (!isfinite(got)) return INFINITY;
    return fabs(got - want) / (ATOL64 + RTOL64 * fabs(want));
}

/* Compare one output with NumPy's; 1 when it matches. */
static int compare(const Case *c, const char *out, const kiln_tensor *got,
                   const kiln_tensor *want) {
    char gs[128], ws[128], is[128];
    if (!same_type(got, want)) {
        shape_str(gs, sizeof gs, got), shape_str(ws, sizeof ws, want);
        case_fail(c, "output %s: got %s, want %s", out, gs, ws);
        return 0;
    }
    int64_t n = kiln_tensor_numel(want), bad = 0, worst = 0;
    double worst_x = -1.0;
    for (int64_t i = 0; i < n; i++) {
        double x;
        if (want->dtype == KILN_BOOL)
            x = ((const uint8_t *)got->data)[i] != ((const uint8_t *)want->data)[i] ? 2.0 : 0.0;
        else if (want->dtype == KILN_F32)
            x = excess(((const float *)got->data)[i], ((const float *)want->data)[i]);
        else if (want->dtype == KILN_F64)
            x = excess64(((const double *)got->data)[i], ((const double *)want->data)[i]);
        else
            x = 2.0; /* gen.py writes only f32, f64 and bool */
        if (x > 1.0) bad++;
        if (x > worst_x) worst_x = x, worst = i;
    }
    if (!bad) return 1;
    index_str(is, sizeof is, want, worst);
    if (want->dtype == KILN_BOOL)
        case_fail(c, "output %s: %lld of %lld differ; first at %s: got %d want %d", out,
                  (long long)bad, (long long)n, is, ((const uint8_t *)got->data)[worst],
                  ((const uint8_t *)want->data)[worst]);
    else if (want->dtype == KILN_F32) {
        float g = ((const float *)got->data)[worst], w = ((const float *)want->data)[worst];
        case_fail(c,
                  "output %s: %lld of %lld out of tolerance; worst at %s: got %.9g want %.9g "
                  "(|diff| %.3g, tol %.3g)",
                  out, (long long)bad, (long long)n, is, g, w, fabs((double)g - w),
                  ATOL + RTOL * fabs((double)w));
    } else if (want->dtype == KILN_F64) {
        double g = ((const double *)got->data)[worst], w = ((const double *)want->data)[worst];
        case_fail(c,
                  "output %s: %lld of %lld out of tolerance; worst at %s: got %.17g want %.17g "
                  "(|diff| %.3g, tol %.3g)",
                  out, (long long)bad, (long long)n, is, g, w, fabs(g - w),
                  ATOL64 + RTOL64 * fabs(w));
    } else
        case_fail(c, "output %s: unexpected dtype %s", out, kiln_dtype_name(want->dtype));
    return 0;
}

/* Read input i of g from <dir>/<name>.npy into *t; 1 on success. */
static int read_input(const Case *c, kiln_graph *g, int i, kiln_tensor *t) {
    char path[1024], file[300], err[512], gs[128], ws[128];
    const char *name = kiln_input_name(g, i);
    snprintf(file, sizeof file, "%s.npy", name);
    if (!path_in(path, sizeof path, c->dir, file)) {
        case_fail(c, "path too long for input %s", name);
        return 0;
    }
    if (kiln_npy_read(path, t, err, sizeof err) != KILN_OK) {
        case_fail(c, "input %s: %s", name, err);
        return 0;
    }
    kiln_tensor decl = kiln_input_desc(g, i);
    if (!same_type(t, &decl)) {
        shape_str(gs, sizeof gs, t), shape_str(ws, sizeof ws, &decl);
        case_fail(c, "input %s: %s holds %s but the program declares %s", name, file, gs, ws);
        return 0;
    }
    return 1;
}

/* Number of expect_*.npy files in dir (-1 if it cannot be read). */
static int count_expected(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        n += strncmp(e->d_name, "expect_", 7) == 0 && len > 4 &&
             strcmp(e->d_name + len - 4, ".npy") == 0;
    }
    closedir(d);
    return n;
}

/* Compare every output of g with its expect_<name>.npy; 1 when all match.
 * Every expected file must belong to an output: a program that lost one
 * fails. */
static int check_outputs(const Case *c, kiln_graph *g, const kiln_tensor *outs) {
    int ok = 1, nexp = count_expected(c->dir);
    if (nexp != kiln_num_outputs(g)) {
        case_fail(c, "the program has %d outputs but %s holds %d expect_*.npy files",
                  kiln_num_outputs(g), c->dir, nexp);
        ok = 0;
    }
    for (int i = 0; i < kiln_num_outputs(g); i++) {
        char path[1024], file[300], err[512];
        const char *name = kiln_output_name(g, i);
        kiln_tensor want = {0};
        snprintf(file, sizeof file, "expect_%s.npy", name);
        if (!path_in(path, sizeof path, c->dir, file)) {
            case_fail(c, "path too long for output %s", name);
            ok = 0;
        } else if (kiln_npy_read(path, &want, err, sizeof err) != KILN_OK) {
            case_fail(c, "output %s: %s", name, err);
            ok = 0;
        } else {
            ok &= compare(c, name, &outs[i], &want);
        }
        kiln_tensor_free(&want);
    }
    return ok;
}

/* Parse, read inputs, interpret, compare. 1 when the case passes. */
static int run_case(const Case *c) {
    char prog[1024];
    int ok = 0, nin = 0, nout = 0;
    kiln_tensor *ins = NULL, *outs = NULL;
    kiln_graph *g = kiln_graph_new();
    if (!g || !path_in(prog, sizeof prog, c->dir, "prog.kiln")) {
        case_fail(c, "out of memory or path too long");
        goto done;
    }
    if (kiln_parse_file(g, prog) != KILN_OK) {
        case_fail(c, "parse: %s", kiln_error(g));
        goto done;
    }
    nin = kiln_num_inputs(g), nout = kiln_num_outputs(g);
    ins = calloc((size_t)nin + 1, sizeof *ins);
    outs = calloc((size_t)nout + 1, sizeof *outs);
    if (!ins || !outs) {
        case_fail(c, "out of memory");
        goto done;
    }
    for (int i = 0; i < nin; i++)
        if (!read_input(c, g, i, &ins[i])) goto done;
    if (kiln_interpret(g, ins, outs) != KILN_OK) {
        case_fail(c, "interpret: %s", kiln_error(g));
        goto done;
    }
    ok = check_outputs(c, g, outs);
done:
    for (int i = 0; ins && i < nin; i++) kiln_tensor_free(&ins[i]);
    for (int i = 0; outs && i < nout; i++) kiln_tensor_free(&outs[i]);
    free(ins);
    free(outs);
    kiln_graph_free(g);
    return ok;
}

/* Strip leading and trailing white space in place. */
static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
    return s;
}

TEST(golden_cases) {
    char root[512], index[600], line[256];
    snprintf(root, sizeof root, "%s/golden/cases", test_srcdir());
    snprintf(index, sizeof index, "%s/index.txt", root);
    FILE *f = fopen(index, "r");
    CHECKF(f, "cannot open %s (regenerate with tests/golden/gen.py)", index);
    const char *only = getenv("KILN_GOLDEN_CASE");
    int listed = 0, ran = 0, failed = 0;
    while (fgets(line, sizeof line, f)) {
        char *name = trim(line);
        if (!*name || *name == '#') continue;
        listed++;
        if (only && !strstr(name, only)) continue;
        Case c = {name, {0}};
        if (!path_in(c.dir, sizeof c.dir, root, name)) {
            case_fail(&c, "path too long");
            failed++;
            continue;
        }
        ran++;
        failed += !run_case(&c);
    }
    fclose(f);
    EXPECT(listed >= MIN_CASES, "%s lists %d cases, expected at least %d", index, listed,
           MIN_CASES);
    EXPECT(failed == 0, "%d of %d golden cases failed", failed, ran);
}
