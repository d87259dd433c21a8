/*
 * test_parse.c -- the .kiln parser: every statement form, every function,
 * precedence, and every class of error with its exact message and caret.
 *
 * Oracles: shapes are the ones PyTorch gives for the same call (written out
 * by hand); precedence is checked by running tiny programs through the
 * reference interpreter against arithmetic done by hand; keyword and
 * positional spellings of a call must give bit-identical results; a builder
 * error re-reported by the parser must carry the same text the builder gives
 * when called directly through the C API. Error tests spell out the whole
 * first line ("t.kiln:2:7: error: ...") and the caret line, and check that
 * the middle line is the source line.
 */
#include "test.h"
#include "graph/graph.h"
#include <dirent.h>
#include <sys/stat.h>

/* ---- helpers --------------------------------------------------------------- */

/* Parse src as "t.kiln"; NULL (and a test failure) when it does not parse. */
static kiln_graph *parse_ok(const char *src) {
    kiln_graph *g = kiln_graph_new();
    if (kiln_parse(g, src, "t.kiln") == KILN_OK) return g;
    test_failf(__FILE__, __LINE__, "parse failed:\n%s\n--- program:\n%s", kiln_error(g), src);
    kiln_graph_free(g);
    return NULL;
}

/* Line n (1-based) of src, into buf. */
static void source_line(const char *src, int n, char *buf, size_t size) {
    while (--n > 0 && strchr(src, '\n')) src = strchr(src, '\n') + 1;
    size_t len = strcspn(src, "\n");
    if (len >= size) len = size - 1;
    memcpy(buf, src, len);
    buf[len] = '\0';
}

/* The three lines of an error: "FILE:L:C: error: MSG", the source, the caret. */
static void check_message(const char *msg, const char *src, const char *first, const char *caret) {
    char want_src[256];
    int line = 0; /* from "FILE:LINE:COL: error:", FILE may hold ':' */
    const char *e = strstr(first, ": error:");
    if (e) {
        const char *c = e - 1;
        while (c > first && *c != ':') c--;
        while (c > first && c[-1] != ':') c--;
        line = atoi(c);
    }
    source_line(src, line, want_src, sizeof want_src);
    const char *nl1 = strchr(msg, '\n'), *nl2 = nl1 ? strchr(nl1 + 1, '\n') : NULL;
    EXPECT(nl1 && nl2 && !strchr(nl2 + 1, '\n'), "not three lines: [%s]", msg);
    if (!nl1 || !nl2) return;
    EXPECT((size_t)(nl1 - msg) == strlen(first) && !strncmp(msg, first, strlen(first)),
           "first line\n    got:  [%.*s]\n    want: [%s]", (int)(nl1 - msg), msg, first);
    EXPECT((size_t)(nl2 - nl1 - 1) == strlen(want_src) &&
               !strncmp(nl1 + 1, want_src, strlen(want_src)),
           "source line of [%s]\n    got:  [%.*s]\n    want: [%s]", first, (int)(nl2 - nl1 - 1),
           nl1 + 1, want_src);
    EXPECT(!strcmp(nl2 + 1, caret), "caret of [%s]\n    got:  [%s]\n    want: [%s]", first, nl2 + 1,
           caret);
}

typedef struct {
    const char *src, *first, *caret;
} ErrCase;

static void expect_error(const ErrCase *c) {
    kiln_graph *g = kiln_graph_new();
    kiln_status st = kiln_parse(g, c->src, "t.kiln");
    EXPECT(st == KILN_ERR_INPUT, "status %d for [%s]", (int)st, c->first);
    check_message(kiln_error(g), c->src, c->first, c->caret);
    kiln_graph_free(g);
}

static void expect_errors(const ErrCase *cases, size_t n) {
    for (size_t i = 0; i < n; i++) expect_error(&cases[i]);
}

#define EXPECT_ERRORS(cases) expect_errors(cases, sizeof cases / sizeof cases[0])

static void format_shape(const kiln_tensor *t, char *buf, size_t size) {
    size_t n = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < t->rank; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    snprintf(buf + n, size - n, "]");
}

/* Element i of a result as a float (bool bytes as 0/1). */
static float at(const kiln_tensor *t, int64_t i) {
    if (t->dtype == KILN_BOOL) return ((const unsigned char *)t->data)[i] ? 1.0f : 0.0f;
    return ((const float *)t->data)[i];
}

/* Parse and interpret; in[i] is input i's data. Returns the output count,
 * -1 on failure. */
static int run(const char *src, void *const *in, kiln_tensor *out) {
    kiln_graph *g = parse_ok(src);
    if (!g) return -1;
    kiln_tensor ins[8];
    for (int i = 0; i < kiln_num_inputs(g) && i < 8; i++) {
        ins[i] = kiln_input_desc(g, i);
        ins[i].data = in[i];
    }
    int n = kiln_num_outputs(g);
    kiln_status st = kiln_interpret(g, ins, out);
    if (st != KILN_OK) test_failf(__FILE__, __LINE__, "interpret: %s", kiln_error(g));
    kiln_graph_free(g);
    return st == KILN_OK ? n : -1;
}

static void free_outputs(kiln_tensor *out, int n) {
    for (int i = 0; i < n; i++) kiln_tensor_free(&out[i]);
}

/* Run two programs with the same inputs; their first outputs must be equal. */
static bool same_results(const char *a, const char *b, void *const *in) {
    kiln_tensor oa[4], ob[4];
    int na = run(a, in, oa), nb = run(b, in, ob);
    bool same = na > 0 && nb > 0 && oa[0].rank == ob[0].rank &&
                kiln_tensor_numel(&oa[0]) == kiln_tensor_numel(&ob[0]);
    for (int64_t i = 0; same && i < kiln_tensor_numel(&oa[0]); i++)
        same = at(&oa[0], i) == at(&ob[0], i);
    free_outputs(oa, na > 0 ? na : 0);
    free_outputs(ob, nb > 0 ? nb : 0);
    return same;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* ---- statements ------------------------------------------------------------- */

TEST(parse_statements) {
    kiln_graph *g = parse_ok("input x: f32[2, 3]\n"
                             "input m: bool[3]\n"
                             "input s: f32[]\n"
                             "weight w: f32[3, 4] = randn(7)\n"
                             "y = x @ w\n"
                             "z = where(m, x, s)\n"
                             "output y, z\n"
                             "output s\n");
    CHECK(g);
    CHECK(kiln_num_inputs(g) == 3 && kiln_num_outputs(g) == 3);
    CHECK(!strcmp(kiln_input_name(g, 0), "x") && !strcmp(kiln_input_name(g, 1), "m"));
    CHECK(!strcmp(kiln_input_name(g, 2), "s"));
    kiln_tensor x = kiln_input_desc(g, 0), m = kiln_input_desc(g, 1), s = kiln_input_desc(g, 2);
    CHECK(x.dtype == KILN_F32 && x.rank == 2 && x.shape[0] == 2 && x.shape[1] == 3);
    CHECK(m.dtype == KILN_BOOL && m.rank == 1 && m.shape[0] == 3);
    CHECK(s.dtype == KILN_F32 && s.rank == 0);
    CHECK(!strcmp(kiln_output_name(g, 0), "y") && !strcmp(kiln_output_name(g, 1), "z"));
    CHECK(!strcmp(kiln_output_name(g, 2), "s"));
    kiln_tensor y = kiln_output_desc(g, 0), z = kiln_output_desc(g, 1);
    CHECK(y.rank == 2 && y.shape[0] == 2 && y.shape[1] == 4);
    CHECK(z.rank == 2 && z.shape[0] == 2 && z.shape[1] == 3);
    CHECK(!strcmp(kiln_error(g), ""));
    kiln_graph_free(g);
}

/* "input", "weight" and "output" are statement keywords only when a name
 * follows, so PyTorch-style variable names still work. */
TEST(parse_keywords_as_names) {
    kiln_graph *g = parse_ok("input input: f32[2]\n"
                             "output = input + 1\n"
                             "weight = output * 2\n"
                             "output output, weight\n");
    CHECK(g);
    CHECK(!strcmp(kiln_input_name(g, 0), "input"));
    CHECK(!strcmp(kiln_output_name(g, 0), "output") && !strcmp(kiln_output_name(g, 1), "weight"));
    kiln_graph_free(g);
}

TEST(parse_weight_inits) {
    kiln_tensor out[5];
    int n = run("weight a: f32[5] = randn(7)\n"
                "weight b: f32[2, 2] = zeros\n"
                "weight c: f32[2] = zeros()\n"
                "weight d: f32[] = ones\n"
                "weight e: f32[3] = ones()\n"
                "output a, b, c, d, e\n",
                NULL, out);
    CHECK(n == 5);
    float want[5];
    kiln_fill_randn(want, 5, 7);
    for (int i = 0; i < 5; i++) EXPECT(at(&out[0], i) == want[i], "randn element %d", i);
    for (int i = 0; i < 4; i++) EXPECT(at(&out[1], i) == 0.0f, "zeros element %d", i);
    EXPECT(at(&out[2], 0) == 0.0f && at(&out[2], 1) == 0.0f, "zeros()");
    EXPECT(out[3].rank == 0 && at(&out[3], 0) == 1.0f, "ones scalar");
    for (int i = 0; i < 3; i++) EXPECT(at(&out[4], i) == 1.0f, "ones() element %d", i);
    free_outputs(out, n);
}

/* file("w.npy") is found next to the program, not in the working directory. */
TEST(parse_weight_file) {
    char dir[512], npy[600], prog[600], err[256];
    snprintf(dir, sizeof dir, "%s/parse_weight_file", test_tmpdir());
    mkdir(dir, 0755);
    snprintf(npy, sizeof npy, "%s/w.npy", dir);
    snprintf(prog, sizeof prog, "%s/prog.kiln", dir);
    float data[6] = {1, -2, 3.5f, 4, 5, 6.25f};
    kiln_tensor w = {KILN_F32, 2, {2, 3}, data};
    CHECK(kiln_npy_write(npy, &w, err, sizeof err) == KILN_OK);
    write_text(prog, "weight w: f32[2, 3] = file(\"w.npy\")\ny = w * 1\noutput y\n");
    kiln_graph *g = kiln_graph_new();
    CHECKF(kiln_parse_file(g, prog) == KILN_OK, "%s", kiln_error(g));
    kiln_tensor out[1];
    CHECK(kiln_interpret(g, NULL, out) == KILN_OK);
    for (int i = 0; i < 6; i++) EXPECT(at(&out[0], i) == data[i], "element %d", i);
    kiln_tensor_free(&out[0]);
    kiln_graph_free(g);
}

/* Every program shipped in examples/ parses. */
TEST(parse_examples) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/../examples", test_srcdir());
    DIR *d = opendir(dir);
    CHECKF(d, "cannot open %s", dir);
    int count = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".kiln")) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        kiln_graph *g = kiln_graph_new();
        EXPECT(kiln_parse_file(g, path) == KILN_OK, "%s", kiln_error(g));
        kiln_graph_free(g);
        count++;
    }
    closedir(d);
    CHECK(count > 0);
}

/* ---- expressions -------------------------------------------------------------- */

typedef struct {
    const char *expr;
    float want;
} ScalarCase;

/* Scalar programs through the interpreter: precedence, associativity,
 * unary minus, number syntax, comparisons. */
TEST(parse_precedence) {
    static const ScalarCase cases[] = {
        {"1 + 2 * 3 - -4", 11},
        {"10 - 3 - 2", 5},
        {"2 - 1 - 1 - 1", -1},
        {"12 / 2 / 3", 2},
        {"2 * 3 + 4 * 5", 26},
        {"(1 + 2) * 3", 9},
        {"-2 * 3", -6},
        {"- -2", 2},
        {"-(1 + 2)", -3},
        {"2 * -3", -6},
        {"1 + 1 < 3", 1},
        {"2 * 2 == 4", 1},
        {"1 - 2 >= 0", 0},
        {"3 != 3", 0},
        {"2 <= 2", 1},
        {"3 > 1 + 1", 1},
        {".5 + 1e1 + 2.5e-1", 10.75f},
        {"1.5E+1", 15},
        {"8 / 2 * 4", 16},
        {"pow(2, 3) - 1", 7},
        {"fmod(-7, 3) + fmod(7.5, -2)", -1 + 1.5f},
        {"-relu(-2) + 1", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char src[256];
        snprintf(src, sizeof src, "y = %s\noutput y\n", cases[i].expr);
        kiln_tensor out[1];
        if (run(src, NULL, out) != 1) continue;
        EXPECT(out[0].rank == 0 && at(&out[0], 0) == cases[i].want, "%s = %g, want %g",
               cases[i].expr, at(&out[0], 0), cases[i].want);
        kiln_tensor_free(&out[0]);
    }
}

TEST(parse_tensor_operators) {
    float a = 10, b = 3, c = 2, x[3] = {1, -2, 3};
    void *in[4] = {&a, &b, &c, x};
    kiln_tensor out[4];
    int n = run("input a: f32[]\ninput b: f32[]\ninput c: f32[]\ninput x: f32[3]\n"
                "s = a - b - c\n" /* left-assoc: 5, not 9 */
                "d = a / b / c\n"
                "n = -x * 2\n"
                "k = x > 0\n"
                "output s, d, n, k\n",
                in, out);
    CHECK(n == 4);
    EXPECT(at(&out[0], 0) == 5.0f, "a - b - c = %g", at(&out[0], 0));
    EXPECT(at(&out[1], 0) == 10.0f / 3.0f / 2.0f, "a / b / c = %g", at(&out[1], 0));
    for (int i = 0; i < 3; i++) {
        EXPECT(at(&out[2], i) == -x[i] * 2, "-x * 2 [%d]", i);
        EXPECT(at(&out[3], i) == (x[i] > 0), "x > 0 [%d]", i);
    }
    free_outputs(out, n);
}

/* '@' binds like '*': b + x @ w is b + (x @ w); (b + x) @ w would not
 * broadcast [4] against [2, 3]. */
TEST(parse_matmul_operator) {
    kiln_graph *g = parse_ok("input x: f32[2, 3]\ninput w: f32[3, 4]\ninput b: f32[4]\n"
                             "y = b + x @ w * 2\noutput y\n");
    CHECK(g);
    kiln_tensor y = kiln_output_desc(g, 0);
    CHECK(y.rank == 2 && y.shape[0] == 2 && y.shape[1] == 4);
    kiln_graph_free(g);
}

TEST(parse_comments_and_lines) {
    kiln_graph *g = parse_ok("# a program\n"
                             "\n"
                             "   \t\n"
                             "input x: f32[2, 3]   # the input\n"
                             "input\tk: f32[4, 3, 1, 1]\r\n"
                             "y = sum(            # a call across lines\n"
                             "    x,\n"
                             "\n"
                             "    dim=[\n"
                             "        0,\n"
                             "        1,\n"
                             "    ],              # trailing commas are fine\n"
                             "    keepdim=true,\n"
                             ")\n"
                             "# between statements\n"
                             "output y  # last");
    CHECK(g);
    kiln_tensor y = kiln_output_desc(g, 0);
    CHECK(y.rank == 2 && y.shape[0] == 1 && y.shape[1] == 1);
    kiln_graph_free(g);
}

/* ---- every function ------------------------------------------------------------- */

typedef struct {
    const char *expr, *shape;
} ShapeCase;

static const char PRELUDE[] = "input x: f32[2, 3]\n"
                              "input x4: f32[2, 3, 4, 5]\n"
                              "input m: bool[2, 3]\n"
                              "input v: f32[3]\n"
                              "input img: f32[1, 2, 5, 5]\n"
                              "input k: f32[4, 2, 3, 3]\n"
                              "input kg: f32[4, 1, 3, 3]\n"
                              "input kb: f32[4]\n"
                              "input c: f32[2]\n";

static const ShapeCase SHAPES[] = {
    {"neg(x)", "[2, 3]"},
    {"abs(x)", "[2, 3]"},
    {"relu(x)", "[2, 3]"},
    {"sigmoid(x)", "[2, 3]"},
    {"tanh(x)", "[2, 3]"},
    {"exp(x)", "[2, 3]"},
    {"log(x)", "[2, 3]"},
    {"sqrt(x)", "[2, 3]"},
    {"rsqrt(x)", "[2, 3]"},
    {"sin(x)", "[2, 3]"},
    {"cos(x)", "[2, 3]"},
    {"erf(x)", "[2, 3]"},
    {"gelu(x)", "[2, 3]"},
    {"silu(x)", "[2, 3]"},
    {"floor(x)", "[2, 3]"},
    {"ceil(x)", "[2, 3]"},
    {"reciprocal(x)", "[2, 3]"},
    {"logical_not(m)", "[2, 3]"},
    {"contiguous(x)", "[2, 3]"},
    {"relu(input=x)", "[2, 3]"},
    {"add(x, v)", "[2, 3]"},
    {"sub(1, x)", "[2, 3]"},
    {"mul(x, 2.5)", "[2, 3]"},
    {"div(v, x)", "[2, 3]"},
    {"pow(x, 2)", "[2, 3]"},
    {"fmod(x, v)", "[2, 3]"},
    {"true_divide(x, v)", "[2, 3]"},
    {"maximum(x, 0)", "[2, 3]"},
    {"minimum(x, v)", "[2, 3]"},
    {"lt(x, 0)", "[2, 3]"},
    {"le(x, v)", "[2, 3]"},
    {"gt(x, 1)", "[2, 3]"},
    {"ge(x, v)", "[2, 3]"},
    {"eq(x, x)", "[2, 3]"},
    {"ne(x, 0)", "[2, 3]"},
    {"add(input=x, other=1)", "[2, 3]"},
    {"add(1, 2)", "[]"},
    {"where(m, x, 0)", "[2, 3]"},
    {"where(x > 0, v, x)", "[2, 3]"},
    {"where(condition=m, input=1, other=v)", "[2, 3]"},
    {"clamp(x, min=0)", "[2, 3]"},
    {"clamp(x, max=1)", "[2, 3]"},
    {"clamp(x, -1, 1)", "[2, 3]"},
    {"clamp(x, None, 1)", "[2, 3]"},
    {"sum(x)", "[]"},
    {"sum(x, 1)", "[2]"},
    {"sum(x, dim=[0, 1])", "[]"},
    {"sum(x, 1, true)", "[2, 1]"},
    {"sum(x4, dim=[1, -1])", "[2, 4]"},
    {"sum(x, dim=None, keepdim=true)", "[1, 1]"},
    {"mean(x, 0)", "[3]"},
    {"amax(x4, dim=2, keepdim=true)", "[2, 3, 1, 5]"},
    {"amin(x, -1)", "[2]"},
    {"prod(x, dim=0)", "[3]"},
    {"softmax(x, 1)", "[2, 3]"},
    {"softmax(x4, dim=-1)", "[2, 3, 4, 5]"},
    {"log_softmax(x, dim=0)", "[2, 3]"},
    {"layer_norm(x, 3)", "[2, 3]"},
    {"layer_norm(x4, [4, 5], eps=1e-6)", "[2, 3, 4, 5]"},
    {"layer_norm(x, [3], v, v)", "[2, 3]"},
    {"layer_norm(x, [3], bias=v)", "[2, 3]"},
    {"batch_norm(img, c, c)", "[1, 2, 5, 5]"},
    {"batch_norm(img, c, c, c, c, 1e-3)", "[1, 2, 5, 5]"},
    {"batch_norm(img, running_mean=c, running_var=c, weight=c, training=false)", "[1, 2, 5, 5]"},
    {"transpose(x, 0, 1)", "[3, 2]"},
    {"transpose(x4, dim0=1, dim1=-1)", "[2, 5, 4, 3]"},
    {"permute(x4, [3, 2, 1, 0])", "[5, 4, 3, 2]"},
    {"permute(x4, 0, 2, 1, 3)", "[2, 4, 3, 5]"},
    {"permute(x, dims=[1, 0])", "[3, 2]"},
    {"reshape(x, [3, 2])", "[3, 2]"},
    {"reshape(x, 6)", "[6]"},
    {"reshape(x, -1)", "[6]"},
    {"reshape(x4, 6, -1)", "[6, 20]"},
    {"reshape(x, shape=[1, 6])", "[1, 6]"},
    {"expand(v, [2, 3])", "[2, 3]"},
    {"expand(v, 4, 3)", "[4, 3]"},
    {"expand(x, size=[5, -1, 3])", "[5, 2, 3]"},
    {"slice(x, 1, 0, 2)", "[2, 2]"},
    {"slice(x, 1, 0, 3, 2)", "[2, 2]"},
    {"slice(x, dim=0, start=1, end=2)", "[1, 3]"},
    {"slice(x, -1, -2, 100)", "[2, 2]"},
    {"matmul(x, transpose(x, 0, 1))", "[2, 2]"},
    {"matmul(input=v, other=v)", "[]"},
    {"x @ reshape(v, [3, 1])", "[2, 1]"},
    {"conv2d(img, k)", "[1, 4, 3, 3]"},
    {"conv2d(img, k, kb, padding=1)", "[1, 4, 5, 5]"},
    {"conv2d(img, k, None, 2, 1)", "[1, 4, 3, 3]"},
    {"conv2d(img, k, stride=[1, 2], padding=[1, 0])", "[1, 4, 5, 2]"},
    {"conv2d(img, k, dilation=2)", "[1, 4, 1, 1]"},
    {"conv2d(img, kg, groups=2)", "[1, 4, 3, 3]"},
    {"rand_like(x)", "[2, 3]"},
    {"rand_like(x, seed=3)", "[2, 3]"},
    {"rand_like(x, 3)", "[2, 3]"},
    {"dropout(x)", "[2, 3]"},
    {"dropout(x, 0.2, 7)", "[2, 3]"},
    {"dropout(x, p=0.1, training=true)", "[2, 3]"},
};

TEST(parse_every_function) {
    for (size_t i = 0; i < sizeof SHAPES / sizeof SHAPES[0]; i++) {
        char src[1024], shape[64];
        snprintf(src, sizeof src, "%sy = %s\noutput y\n", PRELUDE, SHAPES[i].expr);
        kiln_graph *g = parse_ok(src);
        if (!g) continue;
        kiln_tensor y = kiln_output_desc(g, 0);
        format_shape(&y, shape, sizeof shape);
        EXPECT(!strcmp(shape, SHAPES[i].shape), "%s: shape %s, want %s", SHAPES[i].expr, shape,
               SHAPES[i].shape);
        kiln_graph_free(g);
    }
}

/* Each function of the language appears in SHAPES (the table is complete). */
TEST(parse_every_function_listed) {
    static const char *const names[] = {
        "neg",         "abs",         "relu",       "sigmoid",   "tanh",       "exp",
        "log",         "sqrt",        "rsqrt",      "sin",       "cos",        "erf",
        "gelu",        "silu",        "floor",      "ceil",      "reciprocal", "logical_not",
        "contiguous",  "add",         "sub",        "mul",       "div",        "pow",
        "fmod",        "true_divide", "maximum",    "minimum",   "lt",         "le",
        "gt",          "ge",          "eq",         "ne",        "where",      "clamp",
        "sum",         "mean",        "amax",       "amin",      "prod",       "softmax",
        "log_softmax", "layer_norm",  "batch_norm", "transpose", "permute",    "reshape",
        "expand",      "slice",       "matmul",     "conv2d",    "rand_like",  "dropout"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        size_t len = strlen(names[i]);
        bool found = false;
        for (size_t j = 0; j < sizeof SHAPES / sizeof SHAPES[0] && !found; j++)
            found = !strncmp(SHAPES[j].expr, names[i], len) && SHAPES[j].expr[len] == '(';
        EXPECT(found, "%s has no case in SHAPES", names[i]);
    }
}

/* Keyword and positional spellings build the same computation. */
TEST(parse_keyword_positional) {
    float x[6] = {1, -2, 3, 0.5f, 5, -6}, img[50], k[72];
    for (int i = 0; i < 50; i++) img[i] = (float)(i % 7) - 3;
    for (int i = 0; i < 72; i++) k[i] = (float)(i % 5) * 0.25f - 0.5f;
    void *in[3] = {x, img, k};
    static const char *const pairs[][2] = {
        {"softmax(x, 1)", "softmax(dim=1, input=x)"},
        {"sum(x, 1, true)", "sum(x, keepdim=true, dim=1)"},
        {"sum(x, [0, 1])", "sum(x)"},
        {"clamp(x, -1, 2)", "clamp(x, max=2, min=-1)"},
        {"slice(x, 1, 0, 3, 2)", "slice(x, dim=1, step=2, end=3, start=0)"},
        {"permute(x, 1, 0)", "permute(x, [1, 0])"},
        {"reshape(x, 3, 2)", "reshape(x, shape=[3, 2])"},
        {"conv2d(img, k, None, 1, 1)", "conv2d(img, k, padding=1)"},
        {"conv2d(img, k, stride=2)", "conv2d(img, k, stride=[2, 2])"},
        {"layer_norm(x, 3)", "layer_norm(x, normalized_shape=[3], eps=1e-5)"},
        {"dropout(x, 0.5, 3)", "dropout(x, seed=3, training=true)"},
        {"x + 1", "add(x, 1)"},
        {"x @ transpose(x, 0, 1)", "matmul(x, transpose(x, 0, 1))"},
        {"x", "dropout(x, p=0.3, training=false)"}, /* eval mode: identity */
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        char a[512], b[512];
        const char *head =
            "input x: f32[2, 3]\ninput img: f32[1, 2, 5, 5]\ninput k: f32[4, 2, 3, 3]\n";
        snprintf(a, sizeof a, "%sy = %s\noutput y\n", head, pairs[i][0]);
        snprintf(b, sizeof b, "%sy = %s\noutput y\n", head, pairs[i][1]);
        EXPECT(same_results(a, b, in), "%s differs from %s", pairs[i][0], pairs[i][1]);
    }
}

/* Nesting up to the limit parses; past it is an error, not a stack overflow. */
TEST(parse_deep_nesting) {
    char src[2048];
    int n = snprintf(src, sizeof src, "y = ");
    for (int i = 0; i < 150; i++) src[n++] = '(';
    src[n++] = '1';
    for (int i = 0; i < 150; i++) src[n++] = ')';
    snprintf(src + n, sizeof src - (size_t)n, "\noutput y\n");
    kiln_graph *g = parse_ok(src);
    CHECK(g);
    kiln_graph_free(g);
    n = snprintf(src, sizeof src, "y = ");
    for (int i = 0; i < 1000; i++) src[n++] = '-';
    snprintf(src + n, sizeof src - (size_t)n, "1\noutput y\n");
    g = kiln_graph_new();
    CHECK(kiln_parse(g, src, "t.kiln") == KILN_ERR_INPUT);
    CHECKF(strstr(kiln_error(g), "t.kiln:1:205: error: expression nested too deeply\n"), "%s",
           kiln_error(g));
    kiln_graph_free(g);
}

/* ---- errors ------------------------------------------------------------------ */

TEST(parse_error_tokens) {
    static const ErrCase cases[] = {
        {"input x: f32[2]\ny = x $ 1\noutput y", "t.kiln:2:7: error: unexpected character '$'",
         "      ^"},
        {"input x: f32[2]\n\ty =\tx ! 1\noutput y", "t.kiln:2:8: error: unexpected character '!'",
         "\t   \t  ^"},
        {"y = 1 \x01\n", "t.kiln:1:7: error: unexpected character '\\x01'", "      ^"},
        {"y = 1abc\noutput y", "t.kiln:1:5: error: invalid number '1abc'", "    ^"},
        {"y = 1.2.3\noutput y", "t.kiln:1:5: error: invalid number '1.2.3'", "    ^"},
        {"y = 99999999999999999999\n",
         "t.kiln:1:5: error: integer literal '99999999999999999999' is too large", "    ^"},
        {"y = 1e999\n", "t.kiln:1:5: error: number '1e999' is out of range", "    ^"},
        {"weight w: f32[2] = file(\"w.npy)\noutput w", "t.kiln:1:25: error: unterminated string",
         "                        ^"},
        /* a bad token after a syntax error: the syntax error comes first */
        {"y = (\n$", "t.kiln:2:1: error: unexpected character '$'", "^"},
        {"y = )\n$", "t.kiln:1:5: error: expected expression", "    ^"},
    };
    EXPECT_ERRORS(cases);
}

TEST(parse_error_syntax) {
    static const ErrCase cases[] = {
        {"input x: f32[2]\ny = relu(x x)\noutput y",
         "t.kiln:2:12: error: expected ')' after arguments", "           ^"},
        {"input x: f32[2]\ny = relu(x\noutput y", "t.kiln:3:1: error: expected ')' after arguments",
         "^"},
        {"input x: f32[2]\ny = \noutput y", "t.kiln:2:5: error: expected expression", "    ^"},
        {"y = 1 + # nothing\n", "t.kiln:1:9: error: expected expression", "        ^"},
        {"y = (1 + 2", "t.kiln:1:11: error: expected ')'", "          ^"},
        {"y = reshape(1, [1, 2)\n", "t.kiln:1:21: error: expected ']' after list elements",
         "                    ^"},
        {"input x: f32[2]\ny = x x\n",
         "t.kiln:2:7: error: expected end of line after the statement", "      ^"},
        {"input x: f32[2]\ny = x)\n", "t.kiln:2:6: error: unmatched ')'", "     ^"},
        {"input x: f32[2]\nrelu(x)\n", "t.kiln:2:5: error: expected '=' after 'relu'", "    ^"},
        {"1 + 2\n", "t.kiln:1:1: error: expected a statement", "^"},
        {"input a: f32[]\ny = a < a < a\n", "t.kiln:2:11: error: comparisons cannot be chained",
         "          ^"},
        {"input x f32[2]\n", "t.kiln:1:9: error: expected ':' after the input name", "        ^"},
        {"input: f32[2]\n", "t.kiln:1:6: error: expected a name after 'input'", "     ^"},
        {"input x: f32 2\n", "t.kiln:1:14: error: expected '[' after the dtype", "             ^"},
        {"input x: f32[2 3]\n", "t.kiln:1:16: error: expected ',' or ']' in the shape",
         "               ^"},
        {"weight w: f32[2]\n",
         "t.kiln:1:17: error: expected '=' and an initializer after the weight type",
         "                ^"},
        {"weight w: f32[2] = randn()\n", "t.kiln:1:26: error: expected an integer seed",
         "                         ^"},
        {"weight w: f32[2] = 3\n",
         "t.kiln:1:20: error: expected an initializer: randn(seed), zeros, ones or file(\"path\")",
         "                   ^"},
        {"input x: f32[2]\noutput\n", "t.kiln:2:7: error: expected a name after 'output'",
         "      ^"},
        {"input x: f32[2]\noutput x,\n", "t.kiln:2:10: error: expected a name after ','",
         "         ^"},
        {"input x: f32[2]\ny = sum(x, dim=0, 1)\n",
         "t.kiln:2:19: error: positional argument follows keyword argument", "                  ^"},
    };
    EXPECT_ERRORS(cases);
}

TEST(parse_error_calls) {
    static const ErrCase cases[] = {
        {"input x: f32[2]\ny = foo(x)\n", "t.kiln:2:5: error: unknown function 'foo'", "    ^"},
        {"input x: f32[2]\ny = x(1)\n", "t.kiln:2:5: error: unknown function 'x'", "    ^"},
        {"input x: f32[2]\ny = relu(x, x)\n",
         "t.kiln:2:13: error: relu takes 1 positional argument, got 2", "            ^"},
        {"input x: f32[2]\ny = add(x, 1, 2)\n",
         "t.kiln:2:15: error: add takes 2 positional arguments, got 3", "              ^"},
        {"input x: f32[2]\ny = sum(x, 0, true, 1)\n",
         "t.kiln:2:21: error: sum takes at most 3 positional arguments, got 4",
         "                    ^"},
        {"input x: f32[2]\ny = dropout(x, 0.5, 1, true)\n",
         "t.kiln:2:24: error: dropout takes at most 3 positional arguments, got 4",
         "                       ^"},
        {"input x: f32[2]\ny = softmax(x)\n",
         "t.kiln:2:5: error: softmax is missing required argument 'dim'", "    ^"},
        {"y = relu()\n", "t.kiln:1:5: error: relu is missing required argument 'input'", "    ^"},
        {"input x: f32[2]\ny = softmax(x, dimm=0)\n",
         "t.kiln:2:16: error: softmax has no keyword 'dimm'", "               ^"},
        {"input x: f32[2, 2]\ny = sum(x, dim=0, dim=1)\n",
         "t.kiln:2:19: error: duplicate keyword argument 'dim'", "                  ^"},
        {"input x: f32[2, 2]\ny = sum(x, 0, dim=1)\n",
         "t.kiln:2:15: error: sum got multiple values for argument 'dim'", "              ^"},
        {"input x: f32[2]\ny = softmax(x, dim=x)\n",
         "t.kiln:2:20: error: argument 'dim' of softmax must be an int, got a tensor",
         "                   ^"},
        {"input x: f32[2]\ny = transpose(x, 0, 1.5)\n",
         "t.kiln:2:21: error: argument 'dim1' of transpose must be an int, got a float",
         "                    ^"},
        {"input x: f32[2]\ny = sum(x, keepdim=1)\n",
         "t.kiln:2:20: error: argument 'keepdim' of sum must be true or false, got an int",
         "                   ^"},
        {"input x: f32[2]\ny = sum(x, dim=x + 1)\n",
         "t.kiln:2:16: error: argument 'dim' of sum must be an int, a list of ints or None, got a tensor",
         "               ^"},
        {"y = relu([1, 2])\n",
         "t.kiln:1:10: error: argument 'input' of relu must be a tensor, got a list", "         ^"},
        {"y = relu(None)\n",
         "t.kiln:1:10: error: argument 'input' of relu must be a tensor, got None", "         ^"},
        {"input x: f32[2]\ny = clamp(x, min=true)\n",
         "t.kiln:2:18: error: argument 'min' of clamp must be a number or None, got a boolean",
         "                 ^"},
        {"input x: f32[2]\ny = softmax(x, 2147483648)\n",
         "t.kiln:2:16: error: argument 'dim' of softmax is out of range", "               ^"},
        {"input x: f32[2]\ny = rand_like(x, seed=-1)\n",
         "t.kiln:2:23: error: argument 'seed' of rand_like must be non-negative",
         "                      ^"},
        {"input x: f32[2]\ny = reshape(x, [2, x])\n",
         "t.kiln:2:20: error: list elements must be ints, got a tensor", "                   ^"},
        {"input x: f32[2]\ny = permute(x, 0, x)\n",
         "t.kiln:2:19: error: argument 'dims' of permute must be a list of ints, got a tensor",
         "                  ^"},
        {"input x: f32[2]\ny = permute(x, [0], 1)\n",
         "t.kiln:2:21: error: permute takes 2 positional arguments, got 3",
         "                    ^"},
        {"input x: f32[1, 1, 4, 4]\ninput k: f32[1, 1, 1, 1]\ny = conv2d(x, k, stride=[1, 2, 3])\n",
         "t.kiln:3:25: error: argument 'stride' of conv2d must be an int or a list of 2 ints",
         "                        ^"},
        {"input x: f32[1, 2, 2]\ninput c: f32[2]\ny = batch_norm(x, c, c, training=true)\n",
         "t.kiln:3:34: error: batch_norm supports only inference (training=false)",
         "                                 ^"},
        {"y = reshape(1, [1, 1, 1, 1, 1, 1, 1, 1, 1])\n",
         "t.kiln:1:41: error: list has too many elements (at most 8)",
         "                                        ^"},
    };
    EXPECT_ERRORS(cases);
}

TEST(parse_error_values) {
    static const ErrCase cases[] = {
        {"y = true\noutput y\n", "t.kiln:1:5: error: expected a tensor, got a boolean", "    ^"},
        {"y = [1, 2]\noutput y\n", "t.kiln:1:5: error: expected a tensor, got a list", "    ^"},
        {"input x: f32[2]\ny = x + false\n", "t.kiln:2:9: error: expected a tensor, got a boolean",
         "        ^"},
        {"y = -None\n", "t.kiln:1:6: error: expected a tensor, got None", "     ^"},
    };
    EXPECT_ERRORS(cases);
}

TEST(parse_error_names) {
    static const ErrCase cases[] = {
        {"input x: f32[2]\ny = x + z\noutput y", "t.kiln:2:9: error: undefined name 'z'",
         "        ^"},
        {"y = y + 1\n", "t.kiln:1:5: error: undefined name 'y'", "    ^"},
        {"input x: f32[2]\ny = relu\n", "t.kiln:2:5: error: undefined name 'relu'", "    ^"},
        {"input x: f32[2]\ny = x + 1\ny = x * 2\n",
         "t.kiln:3:1: error: 'y' is already defined (at line 2)", "^"},
        {"input x: f32[2]\n\nx = x + 1\n", "t.kiln:3:1: error: 'x' is already defined (at line 1)",
         "^"},
        {"input x: f32[2]\nweight x: f32[2] = ones\n",
         "t.kiln:2:8: error: 'x' is already defined (at line 1)", "       ^"},
        {"input x: f32[2]\ninput x: bool[2]\n",
         "t.kiln:2:7: error: 'x' is already defined (at line 1)", "      ^"},
        {"true = 1\n", "t.kiln:1:1: error: 'true' is a reserved word", "^"},
        {"input None: f32[2]\n", "t.kiln:1:7: error: 'None' is a reserved word", "      ^"},
        {"input x: f32[2]\noutput x, q\n", "t.kiln:2:11: error: undefined name 'q'", "          ^"},
        {"input x: f32[2]\noutput x\noutput x\n", "t.kiln:3:8: error: 'x' is already an output",
         "       ^"},
        {"input x: f32[2]\noutput x, x\n", "t.kiln:2:11: error: 'x' is already an output",
         "          ^"},
    };
    EXPECT_ERRORS(cases);
}

TEST(parse_error_types) {
    static const ErrCase cases[] = {
        {"input x: f16[2]\n", "t.kiln:1:10: error: unknown dtype 'f16'", "         ^"},
        {"input x: i32[2]\n",
         "t.kiln:1:10: error: dtype 'i32' is not supported: programs compute in f32, f64 and bool",
         "         ^"},
        {"input x: i64[2]\n",
         "t.kiln:1:10: error: dtype 'i64' is not supported: programs compute in f32, f64 and bool",
         "         ^"},
        {"input x: f64[2]\nweight w: f64[2] = zeros\n",
         "t.kiln:2:11: error: weights must be f32, got f64", "          ^"},
        {"input x: [2]\n", "t.kiln:1:10: error: expected a type such as f32[2, 3]", "         ^"},
        {"input x: f32[n]\n", "t.kiln:1:14: error: expected a dim (0 or more)", "             ^"},
        {"input x: f32[2.5]\n", "t.kiln:1:14: error: expected a dim (0 or more)", "             ^"},
        {"input x: f32[-3]\n", "t.kiln:1:14: error: dim must not be negative, got -3",
         "             ^"},
        {"input x: f32[1, 1, 1, 1, 1, 1, 1, 1, 1]\n",
         "t.kiln:1:38: error: too many dims: rank is at most 8",
         "                                     ^"},
        {"input x: f32[4294967296, 4294967296]\n",
         "t.kiln:1:13: error: shape [4294967296, 4294967296] has too many elements",
         "            ^"},
        {"weight w: bool[2] = zeros\n", "t.kiln:1:11: error: weights must be f32, got bool",
         "          ^"},
        {"weight w: f32[2] = rand(1)\n",
         "t.kiln:1:20: error: unknown initializer 'rand': expected randn(seed), zeros, ones or "
         "file(\"path\")",
         "                   ^"},
        {"weight w: f32[2] = file(w.npy)\n", "t.kiln:1:25: error: expected a file name string",
         "                        ^"},
    };
    EXPECT_ERRORS(cases);
}

TEST(parse_error_program) {
    static const ErrCase cases[] = {
        {"", "t.kiln:1:1: error: empty program: no statements", "^"},
        {"# only a comment\n\n", "t.kiln:1:1: error: empty program: no statements", "^"},
        {"input x: f32[2]\ny = x + 1\n\n# done\n",
         "t.kiln:2:10: error: program has no output statement", "         ^"},
    };
    EXPECT_ERRORS(cases);
}

/* A builder's error, re-reported at the operator or function name with the
 * builder's own text (obtained here from the C API directly). */
typedef struct {
    const char *src;
    int line, col;
    kiln_value (*direct)(kiln_graph *g, kiln_value a, kiln_value b);
} BuilderCase;

static kiln_value add_direct(kiln_graph *g, kiln_value a, kiln_value b) {
    return kiln_binary(g, "add", a, b);
}
static kiln_value mm_direct(kiln_graph *g, kiln_value a, kiln_value b) {
    (void)b;
    return kiln_matmul(g, a, a);
}
static kiln_value softmax_direct(kiln_graph *g, kiln_value a, kiln_value b) {
    (void)b;
    return kiln_softmax(g, a, 5);
}
static kiln_value neg_direct(kiln_graph *g, kiln_value a, kiln_value b) {
    (void)a;
    return kiln_unary(g, "neg", b);
}
static kiln_value conv_direct(kiln_graph *g, kiln_value a, kiln_value b) {
    kiln_conv_params p = kiln_conv_defaults();
    return kiln_conv2d(g, a, b, KILN_NONE, &p);
}

TEST(parse_error_builder) {
    static const BuilderCase cases[] = {
        {"input a: f32[2, 3]\ninput b: bool[4]\ny = a + b\noutput y\n", 3, 7, add_direct},
        {"input a: f32[2, 3]\ninput b: bool[4]\ny = a @ a\noutput y\n", 3, 7, mm_direct},
        {"input a: f32[2, 3]\ninput b: bool[4]\ny = 1 + softmax(a, 5)\n", 3, 9, softmax_direct},
        {"input a: f32[2, 3]\ninput b: bool[4]\ny = a + - b\n", 3, 9, neg_direct},
        {"input a: f32[2, 3]\ninput b: bool[4]\ny = conv2d(a, b)\n", 3, 5, conv_direct},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const BuilderCase *c = &cases[i];
        kiln_graph *d = kiln_graph_new();
        int64_t sa[2] = {2, 3}, sb[1] = {4};
        kiln_value a = kiln_input(d, "a", KILN_F32, 2, sa),
                   b = kiln_input(d, "b", KILN_BOOL, 1, sb);
        EXPECT(c->direct(d, a, b) == KILN_NONE, "case %zu builds", i);
        char first[1200], caret[64];
        snprintf(first, sizeof first, "t.kiln:%d:%d: error: %s", c->line, c->col, kiln_error(d));
        memset(caret, ' ', (size_t)c->col - 1);
        snprintf(caret + c->col - 1, sizeof caret - (size_t)c->col + 1, "^");
        EXPECT(kiln_error(d)[0] && !strchr(kiln_error(d), '\n'), "builder message [%s]",
               kiln_error(d));
        ErrCase e = {c->src, first, caret};
        expect_error(&e);
        kiln_graph_free(d);
    }
}

TEST(parse_error_weight_file) {
    char dir[512], path[600], err[256], src[1024], first[1200];
    snprintf(dir, sizeof dir, "%s/parse_error_weight_file", test_tmpdir());
    mkdir(dir, 0755);
    double d6[6] = {0};
    float f6[6] = {0};
    kiln_tensor w64 = {KILN_F64, 2, {2, 3}, d6}, w32 = {KILN_F32, 2, {2, 3}, f6};
    snprintf(path, sizeof path, "%s/w64.npy", dir);
    CHECK(kiln_npy_write(path, &w64, err, sizeof err) == KILN_OK);
    snprintf(path, sizeof path, "%s/w32.npy", dir);
    CHECK(kiln_npy_write(path, &w32, err, sizeof err) == KILN_OK);
    static const struct {
        const char *decl, *fmt, *caret;
    } cases[] = {
        {"f32[2, 3] = file(\"w64.npy\")",
         "%s/p.kiln:2:28: error: %s/w64.npy holds f64 data, weight 'w' must be f32",
         "                           ^"},
        {"f32[3, 2] = file('w32.npy')",
         "%s/p.kiln:2:28: error: %s/w32.npy has shape [2, 3], weight 'w' is declared [3, 2]",
         "                           ^"},
        {"f32[6] = file(\"w32.npy\")",
         "%s/p.kiln:2:25: error: %s/w32.npy has shape [2, 3], weight 'w' is declared [6]",
         "                        ^"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(src, sizeof src, "# weights\nweight w: %s\noutput w\n", cases[i].decl);
        snprintf(path, sizeof path, "%s/p.kiln", dir);
        write_text(path, src);
        kiln_graph *g = kiln_graph_new();
        EXPECT(kiln_parse_file(g, path) == KILN_ERR_INPUT, "case %zu parsed", i);
        snprintf(first, sizeof first, cases[i].fmt, dir, dir);
        check_message(kiln_error(g), src, first, cases[i].caret);
        kiln_graph_free(g);
    }
    /* a missing file: the npy reader's message, positioned at the string */
    snprintf(src, sizeof src, "weight w: f32[2] = file(\"nope.npy\")\noutput w\n");
    write_text(path, src);
    kiln_graph *g = kiln_graph_new();
    CHECK(kiln_parse_file(g, path) == KILN_ERR_INPUT);
    snprintf(first, sizeof first, "%s/p.kiln:1:25: error: cannot load weight 'w': ", dir);
    CHECKF(!strncmp(kiln_error(g), first, strlen(first)) && strstr(kiln_error(g), "nope.npy"), "%s",
           kiln_error(g));
    CHECKF(strstr(kiln_error(g), "\n                        ^"), "%s", kiln_error(g));
    kiln_graph_free(g);
}

/* A long line is shown as a window around the column; the caret still
 * points at the culprit and LINE:COL stay exact. */
TEST(parse_error_long_line) {
    char src[1024], first[64];
    int n = snprintf(src, sizeof src, "input x: f32[2]\ny = ");
    for (int i = 0; i < 100; i++) n += snprintf(src + n, sizeof src - (size_t)n, "x + ");
    snprintf(src + n, sizeof src - (size_t)n, "$\noutput y\n");
    kiln_graph *g = kiln_graph_new();
    CHECK(kiln_parse(g, src, "t.kiln") == KILN_ERR_INPUT);
    const char *msg = kiln_error(g);
    snprintf(first, sizeof first, "t.kiln:2:405: error: unexpected character '$'\n");
    CHECKF(!strncmp(msg, first, strlen(first)), "%s", msg);
    const char *shown = msg + strlen(first), *caret = strchr(shown, '\n');
    CHECK(caret);
    caret++;
    CHECKF(strlen(caret) == 80 && caret[79] == '^' && strspn(caret, " ") == 79, "[%s]", caret);
    CHECKF(shown[79] == '$' && shown[80] == '\n', "%s", msg);
    kiln_graph_free(g);
}

TEST(parse_error_missing_file) {
    kiln_graph *g = kiln_graph_new();
    CHECK(kiln_parse_file(g, "/nonexistent/prog.kiln") == KILN_ERR_INPUT);
    CHECKF(!strcmp(kiln_error(g), "cannot read /nonexistent/prog.kiln: No such file or directory"),
           "%s", kiln_error(g));
    kiln_graph_free(g);
    g = kiln_graph_new();
    CHECK(kiln_parse_file(g, test_tmpdir()) == KILN_ERR_INPUT);
    char want[600];
    snprintf(want, sizeof want, "cannot read %s: Is a directory", test_tmpdir());
    CHECKF(!strcmp(kiln_error(g), want), "%s", kiln_error(g));
    kiln_graph_free(g);
}

/* ---- allocation failures -------------------------------------------------------- */

static long alloc_budget; /* allocations left before failing; < 0: unlimited */

static void *failing_alloc(void *ud, void *ptr, size_t oldsize, size_t newsize) {
    (void)ud, (void)oldsize;
    if (newsize == 0) {
        free(ptr);
        return NULL;
    }
    if (alloc_budget == 0) return NULL;
    if (alloc_budget > 0) alloc_budget--;
    return realloc(ptr, newsize);
}

/* Make the n-th allocation fail for n = 0, 1, ...: each failure is
 * KILN_ERR_NOMEM (never a crash or a wrong error), and ASan sees no leak. */
TEST(parse_nomem) {
    const char *src = "input x: f32[2, 3]\nweight w: f32[3, 4] = randn(1)\n"
                      "t = relu(x @ w + 1)\ns = sum(t, dim=1)\noutput t, s\n";
    kiln_set_allocator(failing_alloc, NULL);
    kiln_status st = KILN_ERR_NOMEM;
    int n;
    for (n = 0; n < 1000 && st != KILN_OK; n++) {
        alloc_budget = -1;
        kiln_graph *g = kiln_graph_new();
        if (!g) break;
        alloc_budget = n;
        st = kiln_parse(g, src, "t.kiln");
        alloc_budget = -1;
        EXPECT(st == KILN_OK || st == KILN_ERR_NOMEM, "n=%d: status %d: %s", n, (int)st,
               kiln_error(g));
        kiln_graph_free(g);
    }
    kiln_set_allocator(NULL, NULL);
    CHECKF(st == KILN_OK, "never succeeded (n=%d)", n);
}
