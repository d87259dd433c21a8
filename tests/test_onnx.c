/*
 * test_onnx.c -- the ONNX importer.
 *
 * Small models are built here in C with protobuf-c itself (the generated
 * onnx.pb-c.h), packed to bytes and imported; results are checked against
 * answers computed here by plain loops (the oracle), through both the fused
 * program and the reference interpreter. Then a fixed list of ONNX backend
 * tests from Debian's libonnx-testdata (ONNX's own expected outputs) must
 * pass; it is skipped with a message when the package is absent.
 */
#include "test.h"
#include "cli/cli.h" /* ox_run_test: the conformance runner */
#include <stdint.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>

/* ---- building models -------------------------------------------------------- */

/* Every block a model is built from, freed at once. */
typedef struct {
    void *p[1024];
    int n;
} BlockList;

static void *palloc(BlockList *pool, size_t n) {
    void *p = calloc(1, n ? n : 1);
    if (!p || pool->n == 1024) abort();
    return pool->p[pool->n++] = p;
}

static void blocks_free(BlockList *pool) {
    for (int i = 0; i < pool->n; i++) free(pool->p[i]);
    pool->n = 0;
}

static char *pstr(BlockList *pool, const char *s) { return strcpy(palloc(pool, strlen(s) + 1), s); }

/* A tensor value info; a dim of -1 is symbolic ("N"). */
static Onnx__ValueInfoProto *vinfo(BlockList *pool, const char *name, int elem, int rank,
                                   const int64_t *dims) {
    Onnx__ValueInfoProto *v = palloc(pool, sizeof *v);
    Onnx__TypeProto *t = palloc(pool, sizeof *t);
    Onnx__TypeProto__Tensor *tt = palloc(pool, sizeof *tt);
    Onnx__TensorShapeProto *sp = palloc(pool, sizeof *sp);
    onnx__value_info_proto__init(v);
    onnx__type_proto__init(t);
    onnx__type_proto__tensor__init(tt);
    onnx__tensor_shape_proto__init(sp);
    sp->n_dim = (size_t)rank;
    sp->dim = palloc(pool, sizeof(void *) * (size_t)(rank + 1));
    for (int i = 0; i < rank; i++) {
        Onnx__TensorShapeProto__Dimension *d = palloc(pool, sizeof *d);
        onnx__tensor_shape_proto__dimension__init(d);
        if (dims[i] < 0) {
            d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
            d->dim_param = pstr(pool, "N");
        } else {
            d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
            d->dim_value = dims[i];
        }
        sp->dim[i] = d;
    }
    tt->has_elem_type = 1;
    tt->elem_type = elem;
    tt->shape = sp;
    t->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    t->tensor_type = tt;
    v->name = pstr(pool, name);
    v->type = t;
    return v;
}

/* An f32 (f != NULL) or int64 tensor. */
static Onnx__TensorProto *tensor(BlockList *pool, const char *name, int rank, const int64_t *dims,
                                 const float *f, const int64_t *i64) {
    Onnx__TensorProto *t = palloc(pool, sizeof *t);
    onnx__tensor_proto__init(t);
    int64_t n = 1;
    for (int d = 0; d < rank; d++) n *= dims[d];
    t->name = pstr(pool, name);
    t->n_dims = (size_t)rank;
    t->dims = palloc(pool, sizeof(int64_t) * (size_t)(rank + 1));
    if (rank) memcpy(t->dims, dims, sizeof(int64_t) * (size_t)rank);
    t->has_data_type = 1;
    t->data_type = f ? 1 : 7;
    if (f) {
        t->n_float_data = (size_t)n;
        t->float_data = palloc(pool, sizeof(float) * (size_t)n);
        memcpy(t->float_data, f, sizeof(float) * (size_t)n);
    } else {
        t->n_int64_data = (size_t)n;
        t->int64_data = palloc(pool, sizeof(int64_t) * (size_t)n);
        memcpy(t->int64_data, i64, sizeof(int64_t) * (size_t)n);
    }
    return t;
}

static Onnx__AttributeProto *attr_i(BlockList *pool, const char *name, int64_t v) {
    Onnx__AttributeProto *a = palloc(pool, sizeof *a);
    onnx__attribute_proto__init(a);
    a->name = pstr(pool, name);
    a->has_type = a->has_i = 1;
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
    a->i = v;
    return a;
}

static Onnx__AttributeProto *attr_f(BlockList *pool, const char *name, float v) {
    Onnx__AttributeProto *a = palloc(pool, sizeof *a);
    onnx__attribute_proto__init(a);
    a->name = pstr(pool, name);
    a->has_type = a->has_f = 1;
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT;
    a->f = v;
    return a;
}

static Onnx__AttributeProto *attr_s(BlockList *pool, const char *name, const char *v) {
    Onnx__AttributeProto *a = palloc(pool, sizeof *a);
    onnx__attribute_proto__init(a);
    a->name = pstr(pool, name);
    a->has_type = a->has_s = 1;
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING;
    a->s.data = (uint8_t *)pstr(pool, v);
    a->s.len = strlen(v);
    return a;
}

static Onnx__AttributeProto *attr_ints(BlockList *pool, const char *name, int n, const int64_t *v) {
    Onnx__AttributeProto *a = palloc(pool, sizeof *a);
    onnx__attribute_proto__init(a);
    a->name = pstr(pool, name);
    a->has_type = 1;
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS;
    a->n_ints = (size_t)n;
    a->ints = palloc(pool, sizeof(int64_t) * (size_t)n);
    memcpy(a->ints, v, sizeof(int64_t) * (size_t)n);
    return a;
}

/* A node: inputs and outputs as a space-separated list ("" for none; "-"
 * for an absent optional input), attributes NULL-terminated. */
static char **names(BlockList *pool, const char *list, size_t *n) {
    char *s = pstr(pool, list), **out = palloc(pool, sizeof(char *) * 16);
    *n = 0;
    for (char *t = strtok(s, " "); t; t = strtok(NULL, " ")) out[(*n)++] = strcmp(t, "-") ? t : "";
    return out;
}

static Onnx__NodeProto *node(BlockList *pool, const char *op, const char *ins, const char *outs,
                             Onnx__AttributeProto **attrs) {
    Onnx__NodeProto *n = palloc(pool, sizeof *n);
    onnx__node_proto__init(n);
    n->op_type = pstr(pool, op);
    n->name = pstr(pool, op);
    n->input = names(pool, ins, &n->n_input);
    n->output = names(pool, outs, &n->n_output);
    for (n->n_attribute = 0; attrs && attrs[n->n_attribute];) n->n_attribute++;
    n->attribute = attrs;
    return n;
}

typedef struct {
    Onnx__NodeProto *nodes[16];
    Onnx__ValueInfoProto *in[4], *out[16];
    Onnx__TensorProto *init[8];
    int nnodes, nin, nout, ninit, opset;
} Model;

static uint8_t *pack(BlockList *pool, const Model *md, size_t *len) {
    Onnx__ModelProto m;
    Onnx__GraphProto g;
    Onnx__OperatorSetIdProto op, *ops[1] = {&op};
    onnx__model_proto__init(&m);
    onnx__graph_proto__init(&g);
    onnx__operator_set_id_proto__init(&op);
    op.domain = "";
    op.has_version = 1;
    op.version = md->opset;
    m.has_ir_version = 1;
    m.ir_version = 8;
    m.n_opset_import = 1;
    m.opset_import = ops;
    m.graph = &g;
    g.name = "test";
    g.n_node = (size_t)md->nnodes;
    g.node = (Onnx__NodeProto **)md->nodes;
    g.n_input = (size_t)md->nin;
    g.input = (Onnx__ValueInfoProto **)md->in;
    g.n_output = (size_t)md->nout;
    g.output = (Onnx__ValueInfoProto **)md->out;
    g.n_initializer = (size_t)md->ninit;
    g.initializer = (Onnx__TensorProto **)md->init;
    *len = onnx__model_proto__get_packed_size(&m);
    uint8_t *buf = palloc(pool, *len);
    onnx__model_proto__pack(&m, buf);
    return buf;
}

/* Import the model; KILN_OK or the status with the message in g. */
static kiln_status import(kiln_graph *g, BlockList *pool, const Model *md, int nshapes,
                          const kiln_onnx_input *shapes, kiln_onnx_io *io) {
    size_t len;
    uint8_t *buf = pack(pool, md, &len);
    return kiln_onnx_import_buffer(g, buf, len, "test.onnx", nshapes, shapes, io);
}

/* Run g fused and in the interpreter on one f32 input; both must match
 * want (n values) within 1e-5 relative. */
static int run_both(kiln_graph *g, const kiln_tensor *in, const float *want, int64_t n) {
    kiln_program *p = NULL;
    kiln_tensor out[2] = {{0}};
    if (kiln_compile(g, 1, &p) != KILN_OK) return printf("compile: %s\n", kiln_error(g)), 0;
    int ok =
        kiln_program_run(p, in, &out[0]) == KILN_OK && kiln_interpret(g, in, &out[1]) == KILN_OK;
    for (int r = 0; ok && r < 2; r++) {
        ok &= kiln_tensor_numel(&out[r]) == n;
        for (int64_t k = 0; ok && k < n; k++) {
            float got = ((float *)out[r].data)[k];
            if (fabsf(got - want[k]) > 1e-5f * (1 + fabsf(want[k]))) {
                printf("%s: element %lld is %g, want %g\n", r ? "interpreter" : "fused",
                       (long long)k, got, want[k]);
                ok = 0;
            }
        }
    }
    kiln_tensor_free(&out[0]);
    kiln_tensor_free(&out[1]);
    kiln_program_free(p);
    return ok;
}

static bool has_text(const kiln_graph *g, const char *s) {
    return strstr(kiln_error(g), s) != NULL;
}

/* ---- unit tests ---------------------------------------------------------------- */

/* Shape -> Gather -> Unsqueeze -> Concat -> Reshape folds at import: the
 * graph is input, reshape, relu; no weight for the shape arithmetic. */
TEST(onnx_fold_shape_subgraph) {
    BlockList pool = {0};
    int64_t xs[3] = {2, 3, 4}, ys[2] = {2, 12}, one = 1, zero = 0, minus1 = -1, ax0 = 0;
    Model m = {.opset = 11, .nin = 1, .nout = 1, .ninit = 2};
    m.in[0] = vinfo(&pool, "x", 1, 3, xs);
    m.out[0] = vinfo(&pool, "y", 1, 2, ys);
    m.init[0] = tensor(&pool, "i0", 0, NULL, NULL, &zero);
    m.init[1] = tensor(&pool, "rest", 1, &one, NULL, &minus1);
    Onnx__AttributeProto **ua = palloc(&pool, sizeof(void *) * 2),
                         **ca = palloc(&pool, sizeof(void *) * 2);
    ua[0] = attr_ints(&pool, "axes", 1, &ax0);
    ca[0] = attr_i(&pool, "axis", 0);
    m.nodes[m.nnodes++] = node(&pool, "Shape", "x", "s", NULL);
    m.nodes[m.nnodes++] = node(&pool, "Gather", "s i0", "d0", NULL);
    m.nodes[m.nnodes++] = node(&pool, "Unsqueeze", "d0", "u", ua);
    m.nodes[m.nnodes++] = node(&pool, "Concat", "u rest", "shp", ca);
    m.nodes[m.nnodes++] = node(&pool, "Reshape", "x shp", "r", NULL);
    m.nodes[m.nnodes++] = node(&pool, "Relu", "r", "y", NULL);
    kiln_graph *g = kiln_graph_new();
    kiln_onnx_io io;
    kiln_status st = import(g, &pool, &m, 0, NULL, &io);
    CHECKF(st == KILN_OK, "%s", kiln_error(g));
    CHECK(kiln_num_inputs(g) == 1 && kiln_num_outputs(g) == 1 && io.output_type[0] == KILN_F32);
    kiln_tensor d = kiln_output_desc(g, 0);
    CHECK(d.rank == 2 && d.shape[0] == 2 && d.shape[1] == 12);
    char *dump = NULL;
    size_t dlen;
    FILE *f = open_memstream(&dump, &dlen);
    kiln_graph_dump(g, f);
    fclose(f);
    EXPECT(!strstr(dump, "weight") && !strstr(dump, "gather"), "not folded:\n%s", dump);
    free(dump);
    float x[24], want[24];
    for (int i = 0; i < 24; i++) x[i] = (float)(i - 11), want[i] = x[i] > 0 ? x[i] : 0;
    kiln_tensor in = {KILN_F32, 3, {2, 3, 4}, x};
    CHECK(run_both(g, &in, want, 24));
    kiln_graph_free(g);
    blocks_free(&pool);
}

/* Gemm: alpha * A @ B^T + beta * C, B an initializer (a weight). */
TEST(onnx_gemm_trans_b) {
    BlockList pool = {0};
    int64_t as[2] = {2, 3}, bs[2] = {4, 3}, cs[1] = {4}, ys[2] = {2, 4};
    float b[12], c[4], a[6], want[8];
    for (int i = 0; i < 12; i++) b[i] = (float)(i % 5) - 2;
    for (int i = 0; i < 4; i++) c[i] = (float)i * 0.5f;
    for (int i = 0; i < 6; i++) a[i] = (float)i * 0.25f - 0.5f;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) {
            float s = 0;
            for (int k = 0; k < 3; k++) s += a[i * 3 + k] * b[j * 3 + k];
            want[i * 4 + j] = 2.0f * s + 0.5f * c[j];
        }
    Model m = {.opset = 13, .nin = 1, .nout = 1, .ninit = 2};
    m.in[0] = vinfo(&pool, "a", 1, 2, as);
    m.out[0] = vinfo(&pool, "y", 1, 2, ys);
    m.init[0] = tensor(&pool, "b", 2, bs, b, NULL);
    m.init[1] = tensor(&pool, "c", 1, cs, c, NULL);
    Onnx__AttributeProto **at = palloc(&pool, sizeof(void *) * 4);
    at[0] = attr_i(&pool, "transB", 1);
    at[1] = attr_f(&pool, "alpha", 2.0f);
    at[2] = attr_f(&pool, "beta", 0.5f);
    m.nodes[m.nnodes++] = node(&pool, "Gemm", "a b c", "y", at);
    kiln_graph *g = kiln_graph_new();
    CHECKF(import(g, &pool, &m, 0, NULL, NULL) == KILN_OK, "%s", kiln_error(g));
    kiln_tensor in = {KILN_F32, 2, {2, 3}, a};
    CHECK(run_both(g, &in, want, 8));
    kiln_graph_free(g);
    blocks_free(&pool);
}

/* ArgMax with ties (select_last_index), keepdims 0: an int64 output. */
TEST(onnx_argmax_last_index) {
    BlockList pool = {0};
    int64_t xs[2] = {3, 4}, ys[1] = {3};
    float x[12] = {1, 5, 5, 0, 7, 7, 7, 7, -1, -2, -3, -1}, want[3] = {2, 3, 3};
    Model m = {.opset = 13, .nin = 1, .nout = 1};
    m.in[0] = vinfo(&pool, "x", 1, 2, xs);
    m.out[0] = vinfo(&pool, "y", 7, 1, ys);
    Onnx__AttributeProto **at = palloc(&pool, sizeof(void *) * 4);
    at[0] = attr_i(&pool, "axis", 1);
    at[1] = attr_i(&pool, "keepdims", 0);
    at[2] = attr_i(&pool, "select_last_index", 1);
    m.nodes[m.nnodes++] = node(&pool, "ArgMax", "x", "y", at);
    kiln_graph *g = kiln_graph_new();
    kiln_onnx_io io;
    CHECKF(import(g, &pool, &m, 0, NULL, &io) == KILN_OK, "%s", kiln_error(g));
    CHECK(io.noutputs == 1 && io.output_type[0] == KILN_I64);
    kiln_tensor in = {KILN_F32, 2, {3, 4}, x};
    CHECK(run_both(g, &in, want, 3));
    kiln_graph_free(g);
    blocks_free(&pool);
}

/* An int64 input is f64 in the graph (exact to 2^53); io says int64 on
 * both sides. */
TEST(onnx_int_input_boundary) {
    BlockList pool = {0};
    int64_t xs[1] = {4}, one = 1, three = 3;
    Model m = {.opset = 13, .nin = 1, .nout = 1, .ninit = 1};
    m.in[0] = vinfo(&pool, "x", 7, 1, xs);
    m.out[0] = vinfo(&pool, "y", 7, 1, xs);
    m.init[0] = tensor(&pool, "k", 1, &one, NULL, &three);
    m.nodes[m.nnodes++] = node(&pool, "Div", "x k", "y", NULL);
    kiln_graph *g = kiln_graph_new();
    kiln_onnx_io io;
    CHECKF(import(g, &pool, &m, 0, NULL, &io) == KILN_OK, "%s", kiln_error(g));
    CHECK(io.ninputs == 1 && io.input_type[0] == KILN_I64 && io.output_type[0] == KILN_I64);
    CHECK(kiln_input_desc(g, 0).dtype == KILN_F64);
    int64_t x[4] = {7, -7, 9, 2};
    kiln_tensor xi = {KILN_I64, 1, {4}, x}, xf, yi, out;
    char err[256];
    CHECK(kiln_tensor_convert(&xi, KILN_F64, &xf, err, sizeof err) == KILN_OK);
    CHECK(kiln_interpret(g, &xf, &out) == KILN_OK && out.dtype == KILN_F64);
    double want[4] = {2, -2, 3, 0}; /* integer division truncates toward zero */
    for (int i = 0; i < 4; i++) EXPECT(((double *)out.data)[i] == want[i], "y[%d]", i);
    kiln_tensor_free(&out);
    kiln_tensor_free(&xf);
    /* past 2^53 an int64 does not fit f64 exactly: refused */
    int64_t huge = ((int64_t)1 << 53) + 1;
    kiln_tensor hi = {KILN_I64, 1, {1}, &huge};
    CHECK(kiln_tensor_convert(&hi, KILN_F64, &xf, err, sizeof err) == KILN_ERR_INPUT);
    CHECK(strstr(err, "2^53"));
    /* f32 back to int64 is exact; 2^25 + 1 does not fit f32 exactly */
    float back[2] = {3, -4};
    kiln_tensor bf = {KILN_F32, 1, {2}, back};
    CHECK(kiln_tensor_convert(&bf, KILN_I64, &yi, err, sizeof err) == KILN_OK);
    CHECK(((int64_t *)yi.data)[0] == 3 && ((int64_t *)yi.data)[1] == -4);
    kiln_tensor_free(&yi);
    int64_t big = (1 << 25) + 1;
    kiln_tensor bi = {KILN_I64, 1, {1}, &big};
    CHECK(kiln_tensor_convert(&bi, KILN_F32, &xf, err, sizeof err) == KILN_ERR_INPUT);
    CHECK(strstr(err, "2^24"));
    kiln_graph_free(g);
    blocks_free(&pool);
}

/* int64 arithmetic past f32's 2^24, exact (held in f64 to 2^53): Add,
 * Mul by a constant past 2^24, Div (truncating), Mod (fmod and floor),
 * Equal, CumSum, ReduceSum, Max, a Gather of int64 data by int64 indices,
 * a Cast to float, compiled and interpreted, back to int64 at the
 * boundary. */
TEST(onnx_int64_exact) {
    BlockList pool = {0};
    int64_t s4[1] = {4}, s1[1] = {1}, s5[1] = {5};
    int64_t big = ((int64_t)1 << 40) + 3, k3 = 3,
            tab[5] = {0, (int64_t)1 << 45, -((int64_t)1 << 33) - 1, 7, ((int64_t)1 << 52) - 1};
    Model m = {.opset = 14, .nin = 2, .nout = 11, .ninit = 3};
    m.in[0] = vinfo(&pool, "a", 7, 1, s4);
    m.in[1] = vinfo(&pool, "b", 7, 1, s4);
    m.init[0] = tensor(&pool, "k", 1, s1, NULL, &big);
    m.init[1] = tensor(&pool, "three", 1, s1, NULL, &k3);
    m.init[2] = tensor(&pool, "tab", 1, s5, NULL, tab);
    const char *outs[11] = {"sum", "prod", "quot", "rem", "frem", "eq",
                            "cum", "red",  "mx",   "gat", "fl"};
    for (int i = 0; i < 11; i++)
        m.out[i] = vinfo(&pool, outs[i], i == 5 ? 9 : i == 10 ? 1 : 7, i == 7 ? 0 : 1, s4);
    m.nodes[m.nnodes++] = node(&pool, "Add", "a k", "sum", NULL);
    m.nodes[m.nnodes++] = node(&pool, "Mul", "a three", "prod", NULL);
    m.nodes[m.nnodes++] = node(&pool, "Div", "a b", "quot", NULL);
    m.nodes[m.nnodes++] = node(&pool, "Mod", "a b", "rem", NULL);
    Onnx__AttributeProto **fm = palloc(&pool, sizeof(void *) * 2);
    fm[0] = attr_i(&pool, "fmod", 1);
    m.nodes[m.nnodes++] = node(&pool, "Mod", "a b", "frem", fm);
    m.nodes[m.nnodes++] = node(&pool, "Equal", "a sum", "eq", NULL);
    int64_t zero = 0;
    m.init[m.ninit++] = tensor(&pool, "ax", 0, NULL, NULL, &zero);
    m.nodes[m.nnodes++] = node(&pool, "CumSum", "a ax", "cum", NULL);
    Onnx__AttributeProto **kd = palloc(&pool, sizeof(void *) * 2);
    kd[0] = attr_i(&pool, "keepdims", 0);
    m.nodes[m.nnodes++] = node(&pool, "ReduceSum", "a", "red", kd);
    m.nodes[m.nnodes++] = node(&pool, "Max", "a b", "mx", NULL);
    m.nodes[m.nnodes++] = node(&pool, "Gather", "tab ix", "gat", NULL);
    Onnx__AttributeProto **to = palloc(&pool, sizeof(void *) * 2);
    to[0] = attr_i(&pool, "to", 1);
    m.nodes[m.nnodes++] = node(&pool, "Cast", "a", "fl", to);
    /* the gather's indices: b mod 5, computed in the graph */
    int64_t five = 5;
    m.init[m.ninit++] = tensor(&pool, "five", 1, s1, NULL, &five);
    memmove(&m.nodes[1], &m.nodes[0], sizeof m.nodes[0] * (size_t)m.nnodes);
    m.nnodes++;
    Onnx__AttributeProto **fm2 = palloc(&pool, sizeof(void *) * 2);
    fm2[0] = attr_i(&pool, "fmod", 0);
    m.nodes[0] = node(&pool, "Mod", "b five", "ix", fm2);
    kiln_graph *g = kiln_graph_new();
    kiln_onnx_io io;
    CHECKF(import(g, &pool, &m, 0, NULL, &io) == KILN_OK, "%s", kiln_error(g));
    int64_t a[4] = {((int64_t)1 << 41) + 5, -((int64_t)1 << 35) - 7, 123456789012345, 9};
    int64_t b[4] = {3, ((int64_t)1 << 30) + 1, -1000003, -4};
    kiln_tensor ai = {KILN_I64, 1, {4}, a}, bi = {KILN_I64, 1, {4}, b}, in[2];
    char err[256];
    CHECK(kiln_tensor_convert(&ai, kiln_input_desc(g, 0).dtype, &in[0], err, sizeof err) ==
          KILN_OK);
    CHECK(kiln_tensor_convert(&bi, kiln_input_desc(g, 1).dtype, &in[1], err, sizeof err) ==
          KILN_OK);
    int64_t want[10][4];
    int64_t c = 0, r = 0;
    for (int i = 0; i < 4; i++) {
        want[0][i] = a[i] + big;
        want[1][i] = a[i] * 3;
        want[2][i] = a[i] / b[i]; /* C truncates, as ONNX does */
        int64_t fr = a[i] % b[i];
        want[4][i] = fr;
        want[3][i] = fr != 0 && ((fr < 0) != (b[i] < 0)) ? fr + b[i] : fr; /* floor mod */
        want[5][i] = a[i] == a[i] + big;
        want[6][i] = c += a[i];
        r += a[i];
        want[8][i] = a[i] > b[i] ? a[i] : b[i];
        int64_t ix = ((b[i] % 5) + 5) % 5;
        want[9][i] = tab[ix];
    }
    kiln_program *p = NULL;
    CHECKF(kiln_compile(g, 1, &p) == KILN_OK, "%s", kiln_error(g));
    for (int pass = 0; pass < 2; pass++) {
        kiln_tensor out[11];
        const char *who = pass ? "interpreted" : "compiled";
        kiln_status st = pass ? kiln_interpret(g, in, out) : kiln_program_run(p, in, out);
        CHECKF(st == KILN_OK, "%s: %s", who, pass ? kiln_error(g) : kiln_program_error(p));
        for (int o = 0; o < 11; o++) {
            kiln_tensor t;
            kiln_dtype to_type = io.output_type[o];
            CHECKF(kiln_tensor_convert(&out[o], to_type, &t, err, sizeof err) == KILN_OK,
                   "%s %s: %s", who, outs[o], err);
            for (int i = 0; i < (o == 7 ? 1 : 4); i++) {
                double got = to_type == KILN_F32    ? ((float *)t.data)[i]
                             : to_type == KILN_BOOL ? ((uint8_t *)t.data)[i]
                                                    : (double)((int64_t *)t.data)[i];
                bool ok = o == 7    ? ((int64_t *)t.data)[0] == r
                          : o == 10 ? got == (double)(float)a[i]
                          : o == 5  ? got == (double)want[5][i]
                                    : ((int64_t *)t.data)[i] == want[o][i];
                EXPECT(ok, "%s %s[%d] = %.17g", who, outs[o], i, got);
            }
            kiln_tensor_free(&t);
            kiln_tensor_free(&out[o]);
        }
    }
    kiln_program_free(p);
    kiln_tensor_free(&in[0]), kiln_tensor_free(&in[1]);
    kiln_graph_free(g);
    blocks_free(&pool);
}

/* int32 arithmetic wraps as two's complement, exactly: Add and Sub past
 * 2^31, Mul of products up to 2^62 (split in 16-bit halves), Neg of
 * -2^31, and a Cast of int64 to int32 keeps the low 32 bits. */
TEST(onnx_int32_wraps) {
    BlockList pool = {0};
    int64_t s4[1] = {4};
    Model m = {.opset = 14, .nin = 3, .nout = 5};
    m.in[0] = vinfo(&pool, "a", 6, 1, s4);
    m.in[1] = vinfo(&pool, "b", 6, 1, s4);
    m.in[2] = vinfo(&pool, "c", 7, 1, s4);
    const char *outs[5] = {"sum", "dif", "prod", "neg", "low"};
    for (int i = 0; i < 5; i++) m.out[i] = vinfo(&pool, outs[i], 6, 1, s4);
    m.nodes[m.nnodes++] = node(&pool, "Add", "a b", "sum", NULL);
    m.nodes[m.nnodes++] = node(&pool, "Sub", "a b", "dif", NULL);
    m.nodes[m.nnodes++] = node(&pool, "Mul", "a b", "prod", NULL);
    m.nodes[m.nnodes++] = node(&pool, "Neg", "a", "neg", NULL);
    Onnx__AttributeProto **to = palloc(&pool, sizeof(void *) * 2);
    to[0] = attr_i(&pool, "to", 6);
    m.nodes[m.nnodes++] = node(&pool, "Cast", "c", "low", to);
    kiln_graph *g = kiln_graph_new();
    kiln_onnx_io io;
    CHECKF(import(g, &pool, &m, 0, NULL, &io) == KILN_OK, "%s", kiln_error(g));
    int32_t a[4] = {INT32_MAX, INT32_MIN, 65537, -3}, b[4] = {1, 1, 65537, 1 << 30};
    int64_t c[4] = {((int64_t)1 << 40) + 5, -((int64_t)1 << 35) - 1, (int64_t)INT32_MAX + 1, -7};
    kiln_tensor ai = {KILN_I32, 1, {4}, a}, bi = {KILN_I32, 1, {4}, b}, ci = {KILN_I64, 1, {4}, c};
    kiln_tensor in[3];
    char err[256];
    const kiln_tensor *src[3] = {&ai, &bi, &ci};
    for (int i = 0; i < 3; i++)
        CHECK(kiln_tensor_convert(src[i], kiln_input_desc(g, i).dtype, &in[i], err, sizeof err) ==
              KILN_OK);
    int32_t want[5][4];
    for (int i = 0; i < 4; i++) {
        want[0][i] = (int32_t)((uint32_t)a[i] + (uint32_t)b[i]);
        want[1][i] = (int32_t)((uint32_t)a[i] - (uint32_t)b[i]);
        want[2][i] = (int32_t)((uint32_t)a[i] * (uint32_t)b[i]);
        want[3][i] = (int32_t)(0u - (uint32_t)a[i]);
        want[4][i] = (int32_t)(uint32_t)(uint64_t)c[i];
    }
    kiln_program *p = NULL;
    CHECKF(kiln_compile(g, 1, &p) == KILN_OK, "%s", kiln_error(g));
    for (int pass = 0; pass < 2; pass++) {
        kiln_tensor out[5];
        const char *who = pass ? "interpreted" : "compiled";
        kiln_status st = pass ? kiln_interpret(g, in, out) : kiln_program_run(p, in, out);
        CHECKF(st == KILN_OK, "%s: %s", who, pass ? kiln_error(g) : kiln_program_error(p));
        for (int o = 0; o < 5; o++) {
            kiln_tensor t;
            CHECKF(kiln_tensor_convert(&out[o], KILN_I32, &t, err, sizeof err) == KILN_OK,
                   "%s %s: %s", who, outs[o], err);
            for (int i = 0; i < 4; i++)
                EXPECT(((int32_t *)t.data)[i] == want[o][i], "%s %s[%d] = %d, expected %d", who,
                       outs[o], i, ((int32_t *)t.data)[i], want[o][i]);
            kiln_tensor_free(&t);
            kiln_tensor_free(&out[o]);
        }
    }
    kiln_program_free(p);
    for (int i = 0; i < 3; i++) kiln_tensor_free(&in[i]);
    kiln_graph_free(g);
    blocks_free(&pool);
}

/* A Resize of DOUBLE data by 3 (linear, half_pixel): its interpolation
 * weights (thirds, which no float holds) are doubles too, so the result
 * matches the formula in double; f32 weights would be off by 1e-5 here. */
TEST(onnx_f64_resize_tables) {
    BlockList pool = {0};
    int64_t xs[4] = {1, 1, 2, 2}, ys[4] = {1, 1, 6, 6}, s4[1] = {4};
    float scales[4] = {1, 1, 3, 3};
    Model m = {.opset = 13, .nin = 1, .nout = 1, .ninit = 1};
    m.in[0] = vinfo(&pool, "x", 11, 4, xs);
    m.out[0] = vinfo(&pool, "y", 11, 4, ys);
    m.init[0] = tensor(&pool, "scales", 1, s4, scales, NULL);
    Onnx__AttributeProto **at = palloc(&pool, sizeof(void *) * 2);
    at[0] = attr_s(&pool, "mode", "linear");
    m.nodes[m.nnodes++] = node(&pool, "Resize", "x - scales", "y", at);
    kiln_graph *g = kiln_graph_new();
    kiln_onnx_io io;
    CHECKF(import(g, &pool, &m, 0, NULL, &io) == KILN_OK, "%s", kiln_error(g));
    CHECK(io.output_type[0] == KILN_F64);
    double x[4] = {1000.0, 1000.5, 999.25, 1003.0};
    kiln_tensor in = {KILN_F64, 4, {1, 1, 2, 2}, x};
    kiln_program *p = NULL;
    CHECKF(kiln_compile(g, 1, &p) == KILN_OK, "%s", kiln_error(g));
    for (int pass = 0; pass < 2; pass++) {
        kiln_tensor out;
        kiln_status st = pass ? kiln_interpret(g, &in, &out) : kiln_program_run(p, &in, &out);
        CHECKF(st == KILN_OK, "%s", pass ? kiln_error(g) : kiln_program_error(p));
        const double *y = out.data;
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < 6; j++) {
                double fy = (i + 0.5) / 3 - 0.5, fx = (j + 0.5) / 3 - 0.5;
                fy = fy < 0 ? 0 : fy > 1 ? 1 : fy, fx = fx < 0 ? 0 : fx > 1 ? 1 : fx;
                double top = x[0] * (1 - fx) + x[1] * fx, bot = x[2] * (1 - fx) + x[3] * fx;
                double want = top * (1 - fy) + bot * fy;
                EXPECT(fabs(y[i * 6 + j] - want) < 1e-10, "%s y[%d,%d] %.17g vs %.17g",
                       pass ? "interpreted" : "compiled", i, j, y[i * 6 + j], want);
            }
        kiln_tensor_free(&out);
    }
    kiln_program_free(p);
    kiln_graph_free(g);
    blocks_free(&pool);
}

/* Opset 6 broadcasting: B lines up with A from attribute axis. */
TEST(onnx_legacy_broadcast_axis) {
    BlockList pool = {0};
    int64_t as[3] = {2, 3, 4}, bs[1] = {3};
    float b[3] = {10, 20, 30}, a[24], want[24];
    for (int i = 0; i < 24; i++) a[i] = (float)i, want[i] = a[i] + b[(i / 4) % 3];
    Model m = {.opset = 6, .nin = 1, .nout = 1, .ninit = 1};
    m.in[0] = vinfo(&pool, "a", 1, 3, as);
    m.out[0] = vinfo(&pool, "y", 1, 3, as);
    m.init[0] = tensor(&pool, "b", 1, bs, b, NULL);
    Onnx__AttributeProto **at = palloc(&pool, sizeof(void *) * 3);
    at[0] = attr_i(&pool, "broadcast", 1);
    at[1] = attr_i(&pool, "axis", 1);
    m.nodes[m.nnodes++] = node(&pool, "Add", "a b", "y", at);
    kiln_graph *g = kiln_graph_new();
    CHECKF(import(g, &pool, &m, 0, NULL, NULL) == KILN_OK, "%s", kiln_error(g));
    kiln_tensor in = {KILN_F32, 3, {2, 3, 4}, a};
    CHECK(run_both(g, &in, want, 24));
    kiln_graph_free(g);
    blocks_free(&pool);
}

/* Softmax before opset 13 flattens at axis: over dims 1 and 2 together. */
TEST(onnx_softmax_opset11_flattens) {
    BlockList pool = {0};
    int64_t xs[3] = {2, 3, 4};
    float x[24], want[24];
    for (int i = 0; i < 24; i++) x[i] = (float)((i * 7) % 11) * 0.3f;
    for (int b = 0; b < 2; b++) {
        double s = 0;
        for (int k = 0; k < 12; k++) s += exp(x[b * 12 + k]);
        for (int k = 0; k < 12; k++) want[b * 12 + k] = (float)(exp(x[b * 12 + k]) / s);
    }
    Model m = {.opset = 11, .nin = 1, .nout = 1};
    m.in[0] = vinfo(&pool, "x", 1, 3, xs);
    m.out[0] = vinfo(&pool, "y", 1, 3, xs);
    Onnx__AttributeProto **at = palloc(&pool, sizeof(void *) * 2);
    at[0] = attr_i(&pool, "axis", 1);
    m.nodes[m.nnodes++] = node(&pool, "Softmax", "x", "y", at);
    kiln_graph *g = kiln_graph_new();
    CHECKF(import(g, &pool, &m, 0, NULL, NULL) == KILN_OK, "%s", kiln_error(g));
    kiln_tensor in = {KILN_F32, 3, {2, 3, 4}, x};
    CHECK(run_both(g, &in, want, 24));
    kiln_graph_free(g);
    blocks_free(&pool);
}

/* A symbolic dim needs a shape; given one, the input takes it. */
TEST(onnx_symbolic_dim_binding) {
    BlockList pool = {0};
    int64_t xs[2] = {-1, 4};
    Model m = {.opset = 13, .nin = 1, .nout = 1};
    m.in[0] = vinfo(&pool, "x", 1, 2, xs);
    m.out[0] = vinfo(&pool, "y", 1, 2, xs);
    m.nodes[m.nnodes++] = node(&pool, "Sigmoid", "x", "y", NULL);
    kiln_graph *g = kiln_graph_new();
    CHECK(import(g, &pool, &m, 0, NULL, NULL) == KILN_ERR_INPUT);
    EXPECT(has_text(g, "test.onnx") && has_text(g, "symbolic") && has_text(g, "--shape x="),
           "message: %s", kiln_error(g));
    kiln_graph_free(g);
    kiln_onnx_input s = {"x", 2, {3, 4}, NULL};
    g = kiln_graph_new();
    CHECKF(import(g, &pool, &m, 1, &s, NULL) == KILN_OK, "%s", kiln_error(g));
    CHECK(kiln_input_desc(g, 0).shape[0] == 3);
    kiln_graph_free(g);
    blocks_free(&pool);
}

/* A shape given through the C API keeps every dim the model fixes (as
 * ONNX Runtime): x is declared [N, 4], so [3, 4] imports, [3, 5] and
 * [3, 4, 1] are refused naming both shapes; a mismatch the given shape
 * causes further in names the shape given. */
TEST(onnx_declared_dims_enforced) {
    BlockList pool = {0};
    int64_t xs[2] = {-1, 4}, ws[2] = {4, 2};
    Model m = {.opset = 13, .nin = 1, .nout = 1};
    m.in[0] = vinfo(&pool, "x", 1, 2, xs);
    m.out[0] = vinfo(&pool, "y", 1, 2, xs);
    m.nodes[m.nnodes++] = node(&pool, "Sigmoid", "x", "y", NULL);
    kiln_onnx_input ok = {"x", 2, {3, 4}, NULL}, dim = {"x", 2, {3, 5}, NULL},
                    rank = {"x", 3, {3, 4, 1}, NULL};
    kiln_graph *g = kiln_graph_new();
    CHECKF(import(g, &pool, &m, 1, &ok, NULL) == KILN_OK, "%s", kiln_error(g));
    kiln_graph_free(g);
    g = kiln_graph_new();
    CHECK(import(g, &pool, &m, 1, &dim, NULL) == KILN_ERR_INPUT);
    EXPECT(has_text(g, "input 'x': shape [3,5] given, but the model declares [N,4]: dim 1 is "
                       "fixed at 4"),
           "%s", kiln_error(g));
    kiln_graph_free(g);
    g = kiln_graph_new();
    CHECK(import(g, &pool, &m, 1, &rank, NULL) == KILN_ERR_INPUT);
    EXPECT(has_text(g, "shape [3,4,1] given, but the model declares [N,4] (rank 2)"), "%s",
           kiln_error(g));
    kiln_graph_free(g);
    /* x [N, K] into a MatMul with a 4x2 weight: K = 5 fails at the node */
    int64_t nk[2] = {-1, -1};
    Model mm = {.opset = 13, .nin = 2, .nout = 1};
    mm.in[0] = vinfo(&pool, "x", 1, 2, nk);
    mm.in[1] = vinfo(&pool, "w", 1, 2, ws);
    mm.out[0] = vinfo(&pool, "y", 1, 2, nk);
    mm.nodes[mm.nnodes++] = node(&pool, "MatMul", "x w", "y", NULL);
    g = kiln_graph_new();
    CHECK(import(g, &pool, &mm, 1, &dim, NULL) == KILN_ERR_INPUT);
    EXPECT(has_text(g, "node 0") && has_text(g, "(with the shapes given: x [3,5])"), "%s",
           kiln_error(g));
    kiln_graph_free(g);
    blocks_free(&pool);
}

/* Outputs of model m imported at x of n rows, run fused at that shape
 * through the interpreter (the oracle), compared with got. */
static bool matches_interpreter(BlockList *pool, const Model *m, int64_t n, const float *x,
                                const kiln_tensor *got) {
    kiln_onnx_input s = {"x", 2, {n, 4}, NULL};
    kiln_graph *g = kiln_graph_new();
    kiln_tensor in = {KILN_F32, 2, {n, 4}, (void *)x}, want[2];
    bool ok = import(g, pool, m, 1, &s, NULL) == KILN_OK && kiln_interpret(g, &in, want) == KILN_OK;
    for (int o = 0; ok && o < 2; o++) {
        ok = kiln_tensor_numel(&got[o]) == kiln_tensor_numel(&want[o]);
        for (int64_t k = 0; ok && k < kiln_tensor_numel(&want[o]); k++) {
            float a = ((float *)got[o].data)[k], w = ((float *)want[o].data)[k];
            ok = fabsf(a - w) <= 1e-5f * (1 + fabsf(w));
        }
        kiln_tensor_free(&want[o]);
    }
    kiln_graph_free(g);
    return ok;
}

/* One model, many shapes (kiln.h): x [N, 4] -> Softmax(axis 1) and
 * ReduceSum over N, compiled at N = 2, runs at N = 5 and 3 (each compiled
 * once, then kept), refuses a fixed dim changed, and gives the output
 * shapes of a new shape for run_into. */
TEST(onnx_program_new_shapes) {
    BlockList pool = {0};
    int64_t xs[2] = {-1, 4}, ys[1] = {4};
    Model m = {.opset = 13, .nin = 1, .nout = 2};
    m.in[0] = vinfo(&pool, "x", 1, 2, xs);
    m.out[0] = vinfo(&pool, "p", 1, 2, xs);
    m.out[1] = vinfo(&pool, "s", 1, 1, ys);
    Onnx__AttributeProto **sa = palloc(&pool, sizeof(void *) * 2),
                         **ra = palloc(&pool, sizeof(void *) * 3);
    int64_t ax0 = 0;
    sa[0] = attr_i(&pool, "axis", 1);
    ra[0] = attr_ints(&pool, "axes", 1, &ax0);
    ra[1] = attr_i(&pool, "keepdims", 0);
    m.nodes[m.nnodes++] = node(&pool, "Softmax", "x", "p", sa);
    m.nodes[m.nnodes++] = node(&pool, "ReduceSum", "x", "s", NULL);
    m.opset = 11; /* ReduceSum's axes an attribute */
    m.nodes[1]->attribute = ra;
    m.nodes[1]->n_attribute = 2;
    float x[7 * 4];
    kiln_fill_randn(x, 7 * 4, 77);
    kiln_onnx_input s2 = {"x", 2, {2, 4}, NULL};
    kiln_graph *g = kiln_graph_new();
    CHECKF(import(g, &pool, &m, 1, &s2, NULL) == KILN_OK, "%s", kiln_error(g));
    kiln_program *p = NULL;
    CHECKF(kiln_compile(g, 1, &p) == KILN_OK, "%s", kiln_error(g));
    kiln_graph_free(g);
    kiln_tensor out[2];
    for (int r = 0; r < 4; r++) {
        int64_t n = (int64_t[]){2, 5, 3, 5}[r];
        kiln_tensor in = {KILN_F32, 2, {n, 4}, x};
        CHECKF(kiln_program_run(p, &in, out) == KILN_OK, "N = %lld: %s", (long long)n,
               kiln_program_error(p));
        EXPECT(out[0].shape[0] == n && out[1].rank == 1 && out[1].shape[0] == 4,
               "N = %lld: outputs [%lld, 4] and [%lld]", (long long)n, (long long)out[0].shape[0],
               (long long)out[1].shape[0]);
        EXPECT(matches_interpreter(&pool, &m, n, x, out), "N = %lld: off the interpreter",
               (long long)n);
        for (int o = 0; o < 2; o++) kiln_tensor_free(&out[o]);
    }
    EXPECT(kiln_program_shapes(p) == 3, "%d shapes for N = 2, 5, 3, 5", kiln_program_shapes(p));
    /* the model fixes dim 1 at 4 */
    kiln_tensor bad = {KILN_F32, 2, {3, 5}, x};
    CHECK(kiln_program_run(p, &bad, out) == KILN_ERR_INPUT);
    EXPECT(strstr(kiln_program_error(p), "inputs of a new shape") &&
               strstr(kiln_program_error(p), "dim 1 is fixed at 4"),
           "%s", kiln_program_error(p));
    /* run_into at a new shape: the output memory from kiln_program_outputs_for */
    kiln_tensor in7 = {KILN_F32, 2, {7, 4}, x}, d[2];
    CHECKF(kiln_program_outputs_for(p, &in7, d) == KILN_OK, "%s", kiln_program_error(p));
    CHECK(d[0].rank == 2 && d[0].shape[0] == 7 && d[1].shape[0] == 4 &&
          kiln_program_shapes(p) == 4);
    for (int o = 0; o < 2; o++) CHECK(kiln_tensor_alloc(&d[o]) == KILN_OK);
    CHECKF(kiln_program_run_into(p, &in7, d) == KILN_OK, "%s", kiln_program_error(p));
    EXPECT(matches_interpreter(&pool, &m, 7, x, d), "N = 7 into memory: off the interpreter");
    for (int o = 0; o < 2; o++) kiln_tensor_free(&d[o]);
    kiln_program_free(p);
    /* a program from a graph built directly has its one shape */
    kiln_graph *h = kiln_graph_new();
    kiln_output(h, kiln_unary(h, "relu", kiln_input(h, "x", KILN_F32, 2, (int64_t[]){2, 4})), "y");
    CHECKF(kiln_compile(h, 1, &p) == KILN_OK, "%s", kiln_error(h));
    kiln_tensor in5 = {KILN_F32, 2, {5, 4}, x};
    EXPECT(kiln_program_run(p, &in5, out) == KILN_ERR_INPUT && kiln_program_shapes(p) == 1,
           "a fixed program ran another shape");
    kiln_program_free(p);
    kiln_graph_free(h);
    blocks_free(&pool);
}

/* Errors name the file and the node; unsupported ops say so. */
TEST(onnx_error_messages) {
    BlockList pool = {0};
    int64_t xs[2] = {2, 4}, two = 2;
    Model m = {.opset = 13, .nin = 1, .nout = 1};
    m.in[0] = vinfo(&pool, "x", 1, 2, xs);
    m.out[0] = vinfo(&pool, "y", 1, 2, xs);
    m.nodes[m.nnodes++] = node(&pool, "Relu", "x", "r", NULL);
    m.nodes[m.nnodes++] = node(&pool, "Frobnicate", "r", "y", NULL);
    kiln_graph *g = kiln_graph_new();
    CHECK(import(g, &pool, &m, 0, NULL, NULL) == KILN_ERR_INPUT);
    EXPECT(has_text(g, "test.onnx: unsupported op Frobnicate (opset 13) at node 1"), "%s",
           kiln_error(g));
    kiln_graph_free(g);
    /* several: every one named at once, with its node */
    m.nodes[0] = node(&pool, "Wibble", "x", "r", NULL);
    g = kiln_graph_new();
    CHECK(import(g, &pool, &m, 0, NULL, NULL) == KILN_ERR_INPUT);
    EXPECT(has_text(g, "unsupported ops (opset 13) at 2 nodes: Wibble at node 0") &&
               has_text(g, "Frobnicate at node 1"),
           "%s", kiln_error(g));
    m.nodes[0] = node(&pool, "Relu", "x", "r", NULL);
    kiln_graph_free(g);
    /* a Reshape whose shape is a run-time input */
    Model r = {.opset = 13, .nin = 2, .nout = 1};
    r.in[0] = m.in[0];
    r.in[1] = vinfo(&pool, "shape", 7, 1, &two);
    r.out[0] = m.out[0];
    r.nodes[r.nnodes++] = node(&pool, "Reshape", "x shape", "y", NULL);
    g = kiln_graph_new();
    CHECK(import(g, &pool, &r, 0, NULL, NULL) == KILN_ERR_INPUT);
    EXPECT(has_text(g, "node 0 ('Reshape', Reshape)") && has_text(g, "computed at run time"), "%s",
           kiln_error(g));
    kiln_graph_free(g);
    /* given its value, the model specializes to it */
    int64_t sv[2] = {4, 2};
    kiln_tensor st = {KILN_I64, 1, {2}, sv};
    kiln_onnx_input bind = {"shape", 1, {2}, &st};
    g = kiln_graph_new();
    CHECKF(import(g, &pool, &r, 1, &bind, NULL) == KILN_OK, "%s", kiln_error(g));
    CHECK(kiln_output_desc(g, 0).shape[0] == 4 && kiln_output_desc(g, 0).shape[1] == 2);
    kiln_graph_free(g);
    /* an undefined input name */
    Model u = {.opset = 13, .nin = 1, .nout = 1};
    u.in[0] = m.in[0];
    u.out[0] = m.out[0];
    u.nodes[u.nnodes++] = node(&pool, "Relu", "nope", "y", NULL);
    g = kiln_graph_new();
    CHECK(import(g, &pool, &u, 0, NULL, NULL) == KILN_ERR_INPUT);
    EXPECT(has_text(g, "input 'nope' is not defined"), "%s", kiln_error(g));
    kiln_graph_free(g);
    g = kiln_graph_new();
    CHECK(kiln_onnx_import(g, "/nonexistent/m.onnx", 0, NULL, NULL) == KILN_ERR_INPUT);
    EXPECT(has_text(g, "/nonexistent/m.onnx: cannot open"), "%s", kiln_error(g));
    kiln_graph_free(g);
    blocks_free(&pool);
}

/* Every truncation of a valid model is an error or a smaller valid model
 * (protobuf's wire format allows that), never a crash. */
TEST(onnx_truncated_models) {
    BlockList pool = {0};
    int64_t xs[2] = {2, 4};
    float w[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    Model m = {.opset = 13, .nin = 1, .nout = 1, .ninit = 1};
    m.in[0] = vinfo(&pool, "x", 1, 2, xs);
    m.out[0] = vinfo(&pool, "y", 1, 2, xs);
    m.init[0] = tensor(&pool, "w", 2, xs, w, NULL);
    m.nodes[m.nnodes++] = node(&pool, "Mul", "x w", "y", NULL);
    size_t len;
    uint8_t *buf = pack(&pool, &m, &len);
    int malformed = 0;
    for (size_t k = 0; k < len; k++) {
        kiln_graph *g = kiln_graph_new();
        kiln_status st = kiln_onnx_import_buffer(g, buf, k, "t.onnx", 0, NULL, NULL);
        EXPECT(st == KILN_OK || st == KILN_ERR_INPUT, "length %zu: status %d", k, (int)st);
        malformed += has_text(g, "malformed or truncated");
        kiln_graph_free(g);
    }
    CHECK(malformed > 0);
    blocks_free(&pool);
}

/* External data from memory: read from the folder of the filename given
 * (tests/onnx/ops/external_data_gemm holds weights.bin); under a name in
 * another folder the file is not found, and nothing else is read. */
TEST(onnx_external_data_from_buffer) {
    const char *dir = "tests/onnx/ops/external_data_gemm";
    char path[300];
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    FILE *f = fopen(path, "rb");
    CHECK(f);
    static unsigned char buf[1 << 16];
    size_t len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    kiln_onnx_input sh = {"x", 2, {3, 5}, NULL};
    kiln_graph *g = kiln_graph_new();
    CHECKF(kiln_onnx_import_buffer(g, buf, len, path, 1, &sh, NULL) == KILN_OK, "%s",
           kiln_error(g));
    kiln_graph_free(g);
    g = kiln_graph_new();
    snprintf(path, sizeof path, "%s/model.onnx", test_tmpdir());
    EXPECT(kiln_onnx_import_buffer(g, buf, len, path, 1, &sh, NULL) == KILN_ERR_INPUT &&
               has_text(g, "external data 'weights.bin': cannot open"),
           "elsewhere: %s", kiln_error(g));
    kiln_graph_free(g);
}

/* .pb tensors: written and read back; a truncated file is an error. */
TEST(onnx_pb_roundtrip) {
    char path[600], err[512];
    snprintf(path, sizeof path, "%s/t.pb", test_tmpdir());
    int64_t iv[6] = {1, -2, 3, 1 << 20, 0, -7};
    float fv[6] = {0.5f, -1, 3.25f, 1e-8f, 0, 42};
    uint8_t bv[6] = {1, 0, 1, 1, 0, 0};
    kiln_tensor ts[3] = {
        {KILN_I64, 2, {2, 3}, iv}, {KILN_F32, 2, {3, 2}, fv}, {KILN_BOOL, 1, {6}, bv}};
    for (int i = 0; i < 3; i++) {
        kiln_tensor back;
        CHECK(kiln_pb_write(path, &ts[i], "t", err, sizeof err) == KILN_OK);
        CHECKF(kiln_pb_read(path, &back, err, sizeof err) == KILN_OK, "%s", err);
        CHECK(back.dtype == ts[i].dtype && back.rank == ts[i].rank);
        CHECK(back.shape[0] == ts[i].shape[0]);
        CHECK(!memcmp(back.data, ts[i].data, 6 * kiln_dtype_size(back.dtype)));
        kiln_tensor_free(&back);
    }
    FILE *f = fopen(path, "r+b");
    CHECK(f);
    fclose(f);
    CHECK(truncate(path, 9) == 0);
    kiln_tensor back;
    CHECK(kiln_pb_read(path, &back, err, sizeof err) == KILN_ERR_INPUT);
    EXPECT(strstr(err, "t.pb") != NULL, "%s", err);
}

/* ---- allocation failure ------------------------------------------------------ */

/* A hook that refuses request fail_at and keeps the live blocks, so a run
 * under it can be checked for leaks (as in test_alloc.c). */
typedef struct {
    long requests, fail_at;
    int nlive;
    void *live[4096];
} Hook;

static void *hook_alloc(void *ud, void *ptr, size_t old, size_t n) {
    Hook *h = ud;
    (void)old;
    for (int i = h->nlive - 1; ptr && i >= 0; i--)
        if (h->live[i] == ptr) {
            h->live[i] = h->live[--h->nlive];
            break;
        }
    if (n == 0) return free(ptr), NULL;
    if (++h->requests == h->fail_at || h->nlive == 4096) {
        if (ptr) h->live[h->nlive++] = ptr; /* a failed realloc keeps the block */
        return NULL;
    }
    void *p = realloc(ptr, n);
    h->live[h->nlive++] = p;
    return p;
}

/* Import buf with allocation fail_at refused; the status, leaks in *leaked. */
static kiln_status import_with_hook(Hook *h, const uint8_t *buf, size_t len, int *leaked) {
    kiln_set_allocator(hook_alloc, h);
    kiln_graph *g = kiln_graph_new();
    kiln_status st =
        g ? kiln_onnx_import_buffer(g, buf, len, "a.onnx", 0, NULL, NULL) : KILN_ERR_NOMEM;
    kiln_graph_free(g);
    kiln_set_allocator(NULL, NULL);
    *leaked = h->nlive;
    for (int i = 0; i < h->nlive; i++) free(h->live[i]);
    return st;
}

/* Every allocation of an import refused in turn: out of memory each time
 * (never another status, a crash or a leak). The model folds constants,
 * materializes weights and builds composites. */
TEST(onnx_alloc_fail_each) {
    BlockList pool = {0};
    int64_t xs[2] = {2, 4}, ws[2] = {3, 4}, ys[2] = {2, 3}, zero = 0, one = 1, m1 = -1;
    float w[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    Model m = {.opset = 13, .nin = 1, .nout = 2, .ninit = 3};
    m.in[0] = vinfo(&pool, "x", 1, 2, xs);
    m.out[0] = vinfo(&pool, "y", 1, 2, ys);
    m.out[1] = vinfo(&pool, "c", 7, 1, &xs[0]);
    m.init[0] = tensor(&pool, "w", 2, ws, w, NULL);
    m.init[1] = tensor(&pool, "zero", 0, NULL, NULL, &zero);
    m.init[2] = tensor(&pool, "m1", 1, &one, NULL, &m1);
    Onnx__AttributeProto **ta = palloc(&pool, sizeof(void *) * 2),
                         **aa = palloc(&pool, sizeof(void *) * 2);
    ta[0] = attr_i(&pool, "transB", 1);
    aa[0] = attr_i(&pool, "axis", 1);
    m.nodes[m.nnodes++] = node(&pool, "Gemm", "x w", "h", ta);
    m.nodes[m.nnodes++] = node(&pool, "Shape", "h", "s", NULL);
    m.nodes[m.nnodes++] = node(&pool, "Gather", "s zero", "n", NULL);
    m.nodes[m.nnodes++] = node(&pool, "Softmax", "h", "y", NULL);
    m.nodes[m.nnodes++] = node(&pool, "ArgMax", "y", "c0", aa);
    m.nodes[m.nnodes++] = node(&pool, "Reshape", "c0 m1", "c", NULL);
    size_t len;
    uint8_t *buf = pack(&pool, &m, &len);
    Hook clean = {0};
    int leaked, bad = 0;
    CHECK(import_with_hook(&clean, buf, len, &leaked) == KILN_OK && leaked == 0);
    CHECK(clean.requests > 20);
    for (long k = 1; k <= clean.requests && bad < 5; k++) {
        Hook h = {.fail_at = k};
        kiln_status st = import_with_hook(&h, buf, len, &leaked);
        if (st == KILN_ERR_NOMEM && leaked == 0) continue;
        test_failf(__FILE__, __LINE__, "allocation %ld refused: status %d, %d leaked", k, (int)st,
                   leaked);
        bad++;
    }
    printf("  (onnx import: refused each of allocations 1..%ld in turn)\n", clean.requests);
    blocks_free(&pool);
}

/* ---- regression inputs ------------------------------------------------------ */

/* Every file of tests/onnx/regress (inputs that once crashed the importer)
 * imports with the status and message tests/onnx/regress/expect.txt says,
 * and every file there has its line. */
TEST(onnx_regress_inputs) {
    char dir[600], path[800], line[1024];
    snprintf(dir, sizeof dir, "%s/onnx/regress", test_srcdir());
    snprintf(path, sizeof path, "%s/expect.txt", dir);
    FILE *f = fopen(path, "r");
    CHECKF(f, "cannot open %s", path);
    int checked = 0;
    while (fgets(line, sizeof line, f)) {
        char file[128];
        int status, used = 0;
        line[strcspn(line, "\n")] = 0;
        if (line[0] == '#' || sscanf(line, "%127s %d %n", file, &status, &used) < 2 || !used)
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, file);
        kiln_graph *g = kiln_graph_new();
        kiln_status st = kiln_onnx_import(g, path, 0, NULL, NULL);
        EXPECT((int)st == status && strstr(kiln_error(g), line + used), "%s: status %d, %s", file,
               (int)st, kiln_error(g));
        kiln_graph_free(g);
        checked++;
    }
    fclose(f);
    DIR *d = opendir(dir);
    int files = 0;
    for (struct dirent *e; d && (e = readdir(d));) files += strstr(e->d_name, ".onnx") != NULL;
    if (d) closedir(d);
    CHECKF(files == checked, "%d .onnx files, %d lines in expect.txt", files, checked);
}

/* ---- the fixed conformance list ---------------------------------------------- */

/* ONNX backend tests (libonnx-testdata) that must pass: fused and in the
 * interpreter, against ONNX's expected outputs. They span the ops of the
 * importer that do not depend on other branches' builders. */
static const char *const must_pass[] = {
    /* f64 computed in double: casts both ways, a reduction, CumSum, Mod,
     * an einsum's contraction and a broadcast add */
    "node/test_cast_DOUBLE_to_FLOAT",
    "node/test_cast_FLOAT_to_DOUBLE",
    "node/test_castlike_DOUBLE_to_FLOAT16_expanded",
    "node/test_reduce_log_sum_exp_keepdims_random",
    "node/test_cumsum_2d_axis_1",
    "node/test_mod_mixed_sign_float64",
    "node/test_einsum_batch_matmul",
    "node/test_max_float64",
    "pytorch-operator/test_operator_add_size1_right_broadcast",
    "node/test_range_float_type_positive_delta_expanded", /* trip count from -i floats */
    "node/test_det_nd",
    "simple/test_gradient_of_add_and_mul",
    "node/test_roialign_aligned_true",
    "node/test_melweightmatrix",
    "node/test_adam", /* ai.onnx.preview.training */
    "node/test_nesterov_momentum",
    "node/test_adagrad_multiple",
    "simple/test_sequence_model3", /* sequences held at import */
    "simple/test_sequence_model6",
    "node/test_tfidfvectorizer_tf_batch_uniandbigrams_skip5",
    "node/test_loop11",   /* unrolled; its constants renamed per pass */
    "node/test_scan_sum", /* Scan-8, a batch of one */
    "node/test_scan9_sum",
    "node/test_dynamicquantizelinear", /* ties: true_divide, not a reciprocal multiply */
    "node/test_qlinearconv",
    "node/test_quantizelinear_axis",
    "node/test_convinteger_with_padding",
    "node/test_matmulinteger",
    "node/test_bitshift_left_uint16",
    "node/test_add_uint8",
    "node/test_max_int8",
    "node/test_cast_FLOAT_to_FLOAT16",
    "node/test_cast_BFLOAT16_to_FLOAT", /* bfloat16 data stored as uint16 bits */
    "node/test_mod_mixed_sign_float16",
    "node/test_gridsample_zeros_padding", /* held an extern after its epilogue (sched.c) */
    "node/test_gridsample_bicubic",
    "node/test_atan",
    "node/test_acos_example",
    "node/test_mod_mixed_sign_int64",
    "node/test_top_k_smallest",
    "node/test_reversesequence_batch",
    "node/test_compress_negative_axis",
    "node/test_nonzero_example",
    "node/test_dft_inverse",
    "node/test_stft_with_window",
    "node/test_blackmanwindow_symmetric",
    "node/test_maxunpool_export_with_output_shape",
    "node/test_eyelike_populate_off_main_diagonal",
    "node/test_resize_upsample_scales_linear",
    "node/test_resize_downsample_scales_cubic_A_n0p5_exclude_outside",
    "node/test_resize_downsample_scales_linear_align_corners",
    "node/test_resize_tf_crop_and_resize",
    "node/test_resize_upsample_sizes_nearest_floor_align_corners",
    "node/test_resize_downsample_sizes_nearest_tf_half_pixel_for_nn",
    "node/test_upsample_nearest",
    "node/test_gathernd_example_int32_batch_dim1",
    "node/test_scatter_elements_with_duplicate_indices",
    "node/test_scatternd_multiply",
    "node/test_scatter_with_axis",
    "node/test_onehot_negative_indices",
    "node/test_onehot_with_axis",
    "node/test_lrn",
    "node/test_if",
    "node/test_lstm_with_peepholes",
    "node/test_lstm_batchwise",
    "node/test_gru_seq_length",
    "node/test_simple_rnn_batchwise",
    "node/test_rnn_seq_length",
    "node/test_gather_elements_negative_indices",
    "node/test_gather_elements_1",
    "node/test_nllloss_NCd1d2_with_weight_reduction_mean",
    "node/test_nllloss_NCd1d2d3_sum_weight_high_ii",
    "node/test_nllloss_NCd1d2d3_none_no_weight_negative_ii_expanded",
    "node/test_sce_mean_weight_ii_4d_log_prob",
    "node/test_sce_none_weights_expanded",
    "node/test_abs",
    "node/test_add_bcast",
    "node/test_argmax_keepdims_random_select_last_index",
    "node/test_argmax_negative_axis_keepdims_example",
    "node/test_argmin_no_keepdims_random",
    "node/test_batchnorm_epsilon",
    "node/test_ceil",
    "node/test_clip_default_inbounds",
    "node/test_clip_splitbounds",
    "node/test_constant",
    "node/test_constantofshape_int_zeros",
    "node/test_conv_with_autopad_same",
    "node/test_conv_with_strides_no_padding",
    "node/test_div_bcast",
    "node/test_dropout_default",
    "node/test_elu",
    "node/test_equal_bcast",
    "node/test_erf",
    "node/test_exp",
    "node/test_expand_dim_changed",
    "node/test_flatten_axis0",
    "node/test_flatten_negative_axis1",
    "node/test_gemm_all_attributes",
    "node/test_gemm_transposeB",
    "node/test_globalaveragepool",
    "node/test_globalmaxpool_precomputed",
    "node/test_greater_bcast",
    "node/test_hardsigmoid",
    "node/test_hardswish",
    "node/test_instancenorm_epsilon",
    "node/test_layer_normalization_3d_axis1_epsilon",
    "node/test_leakyrelu",
    "node/test_less_bcast",
    "node/test_log",
    "node/test_logsoftmax_axis_1",
    "node/test_matmul_3d",
    "node/test_max_float32",
    "node/test_mean_two_inputs",
    "node/test_min_two_inputs",
    "node/test_mul_bcast",
    "node/test_neg",
    "node/test_not_2d",
    "node/test_pow_bcast_array",
    "node/test_prelu_broadcast",
    "node/test_range_float_type_positive_delta",
    "node/test_reciprocal",
    "node/test_reduce_l2_keep_dims_random",
    "node/test_reduce_max_default_axes_keepdim_example",
    "node/test_reduce_mean_keepdims_random",
    "node/test_reduce_prod_do_not_keepdims_random",
    "node/test_reduce_sum_square_negative_axes_keepdims_random",
    "node/test_reduce_sum_keepdims_random",
    "node/test_relu",
    "node/test_reshape_negative_extended_dims",
    "node/test_selu",
    "node/test_shape_start_1_end_negative_1",
    "node/test_sigmoid",
    "node/test_size",
    "node/test_slice_default_steps",
    "node/test_softmax_axis_0",
    "node/test_split_equal_parts_2d",
    "node/test_sqrt",
    "node/test_squeeze_negative_axes",
    "node/test_sub_bcast",
    "node/test_sum_one_input",
    "node/test_tanh",
    "node/test_tile",
    "node/test_transpose_all_permutations_3",
    "node/test_unsqueeze_two_axes",
    "node/test_where_example",
    "pytorch-converted/test_BatchNorm2d_eval",
    "pytorch-converted/test_Conv1d_dilated",
    "pytorch-converted/test_Conv2d_groups",
    "pytorch-converted/test_Linear",
    "pytorch-converted/test_PReLU_2d_multiparam",
    "pytorch-converted/test_Softmax",
    "pytorch-operator/test_operator_mm",
    "pytorch-operator/test_operator_view",
    "simple/test_single_relu_model",
    "node/test_batchnorm_example_training_mode",
    "node/test_layer_normalization_2d_axis0_expanded",
    "node/test_reduce_sum_default_axes_keepdims_example",
    "node/test_training_dropout_zero_ratio_mask",
    "node/test_reshape_reordered_all_dims",
    "pytorch-converted/test_Conv1d_pad1",
    "simple/test_expand_shape_model1",
    "node/test_softmax_default_axis",
    "node/test_or_bcast3v1d",
    "node/test_hardmax_axis_1",
    "node/test_depthtospace_crd_mode_example",
    "node/test_spacetodepth_example",
    "node/test_triu_one_row",
    "node/test_round",
    "node/test_sign",
    "node/test_mvn",
    "node/test_isinf_negative",
};

/* Tests of ops whose builders were written apart from the importer (pad,
 * concat, pools, gather, conv_transpose2d, negative slice steps): they
 * must pass now that those builders exist. */
static const char *const must_pass_builders[] = {
    "node/test_maxpool_2d_pads",
    "node/test_maxpool_with_argmax_2d_precomputed_pads",
    "node/test_averagepool_2d_pads_count_include_pad",
    "node/test_averagepool_2d_ceil",
    "node/test_averagepool_3d_default",
    "node/test_concat_3d_axis_negative_2",
    "node/test_constant_pad",
    "node/test_edge_pad",
    "node/test_reflect_pad",
    "node/test_gather_1",
    "node/test_gather_negative_indices",
    "node/test_convtranspose_pads",
    "node/test_convtranspose_3d",
    "node/test_slice_neg_steps",
    "node/test_conv_with_strides_and_asymmetric_padding",
    "pytorch-converted/test_Conv3d_stride_padding",
    "pytorch-converted/test_MaxPool1d_stride_padding_dilation",
    "pytorch-converted/test_ConvTranspose2d",
    "pytorch-operator/test_operator_concat2",
    /* empty tensors (decompose.c): an empty input, an empty result of a
     * run-time input, empty pieces */
    "node/test_constantofshape_int_shape_zero",
    "node/test_reshape_allowzero_reordered",
    "node/test_slice_start_out_of_bounds",
    "node/test_split_zero_size_splits",
    "node/test_tril_zero",
    "simple/test_sequence_model8",
};

/* Do the other branches' builders exist? A stub fails "not implemented". */
static bool builders_ready(void) {
    kiln_graph *g = kiln_graph_new();
    int64_t s[4] = {1, 1, 4, 4}, z[4] = {0, 0, 1, 1};
    kiln_value x = kiln_input(g, "x", KILN_F32, 4, s), i = kiln_input(g, "i", KILN_F32, 1, s);
    kiln_value xs[2] = {x, x};
    kiln_pool_params p = {.nspatial = 2, .kernel = {2, 2}, .stride = {1, 1}, .dilation = {1, 1}};
    kiln_conv_transpose_params t = {{1, 1}, {0, 0}, {0, 0}, {1, 1}, 1};
    bool ok = kiln_pad(g, x, KILN_PAD_CONSTANT, 4, z, z, 0) >= 0 && kiln_concat(g, 2, xs, 1) >= 0 &&
              kiln_max_pool(g, x, &p) >= 0 && kiln_avg_pool(g, x, &p) >= 0 &&
              kiln_gather(g, x, i, 3) >= 0 && kiln_conv_transpose2d(g, x, x, KILN_NONE, &t) >= 0 &&
              kiln_slice(g, x, 3, 3, -5, -1) >= 0;
    if (!ok) printf("  (builders from other branches absent: %s)\n", kiln_error(g));
    kiln_graph_free(g);
    return ok;
}

static int run_list(const char *root, const char *const *list, size_t n) {
    int failed = 0;
    for (size_t i = 0; i < n; i++) {
        char dir[600], why[2048] = "";
        snprintf(dir, sizeof dir, "%s/%s", root, list[i]);
        kiln_options o = kiln_default_options();
        o.threads = 1;
        OxTestVerdict v = ox_run_test(dir, &o, true, why, sizeof why);
        EXPECT(v == OXT_PASS, "%s: %s", list[i], why);
        failed += v != OXT_PASS;
    }
    return failed;
}

TEST(onnx_conformance_fixed_list) {
    const char *root = "/usr/share/libonnx-testdata/data";
    if (access(root, R_OK) != 0) {
        printf("onnx_conformance_fixed_list: skipped: %s is absent "
               "(apt-get install libonnx-testdata)\n",
               root);
        return;
    }
    int failed = run_list(root, must_pass, sizeof must_pass / sizeof must_pass[0]);
    if (builders_ready())
        failed += run_list(root, must_pass_builders,
                           sizeof must_pass_builders / sizeof must_pass_builders[0]);
    else
        printf("  (%zu tests of those builders' ops skipped)\n",
               sizeof must_pass_builders / sizeof must_pass_builders[0]);
    CHECK(failed == 0);
}

/* ---- memory at import ----------------------------------------------------------- */

typedef struct {
    int64_t live, peak;
} Peak;

static void *peak_alloc(void *ud, void *ptr, size_t old, size_t n) {
    Peak *p = ud;
    if (n == 0) {
        free(ptr);
        p->live -= (int64_t)old;
        return NULL;
    }
    void *q = realloc(ptr, n);
    if (q) {
        p->live += (int64_t)n - (int64_t)old;
        if (p->live > p->peak) p->peak = p->live;
    }
    return q;
}

/* Importing a model file holds a large weight about twice over at most:
 * the file's bytes or their unpacked protobuf copy, then the graph's
 * weight, made straight from the payload (a large rank-2 or rank-4 f32
 * initializer never becomes doubles). The file's bytes go once unpacked,
 * each initializer's payload once read, and the bytes kept for importing
 * again at other shapes are copied only after the import's own memory is
 * freed (a symbolic dim here, so they are kept). Before, the file, its
 * unpacked copy, the constants (doubles) and the weights were all held at
 * once, with a buffer between constants and weights: 7 times. */
TEST(onnx_import_memory_peak) {
    BlockList pool = {0};
    enum { K = 1024, N = 256 };
    int64_t ws[2] = {K, N}, xs[2] = {-1, K}, ys[2] = {-1, N};
    float *w = palloc(&pool, sizeof(float) * K * N);
    kiln_fill_randn(w, K * N, 5);
    Model m = {.opset = 13, .nin = 1, .nout = 1, .ninit = 1, .nnodes = 1};
    m.in[0] = vinfo(&pool, "x", 1, 2, xs);
    m.out[0] = vinfo(&pool, "y", 1, 2, ys);
    m.init[0] = tensor(&pool, "w", 2, ws, w, NULL);
    m.nodes[0] = node(&pool, "MatMul", "x w", "y", NULL);
    size_t len;
    uint8_t *buf = pack(&pool, &m, &len);
    char path[600];
    snprintf(path, sizeof path, "%s/peak.onnx", test_tmpdir());
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(buf, 1, len, f) == len && fclose(f) == 0);
    kiln_onnx_input given = {.name = "x", .rank = 2, .shape = {2, K}};
    Peak pk = {0, 0};
    kiln_graph *g = kiln_graph_new();
    kiln_set_allocator(peak_alloc, &pk);
    pk.live = pk.peak = 0;
    kiln_status st = kiln_onnx_import(g, path, 1, &given, NULL);
    kiln_set_allocator(NULL, NULL);
    EXPECT(st == KILN_OK, "%s", kiln_error(g));
    double bytes = sizeof(float) * K * N, ratio = (double)pk.peak / bytes;
    printf("  import peak %.2f x the weights\n", ratio);
    EXPECT(ratio < 2.5, "peak %.2f MiB during import, %.2f x the weights' %.2f MiB",
           (double)pk.peak / 1048576.0, ratio, bytes / 1048576.0);
    /* the bytes kept (read again from the file) import it at a new batch */
    kiln_program *p = NULL;
    CHECK(st == KILN_OK && kiln_compile(g, 1, &p) == KILN_OK);
    for (int64_t b = 2; b <= 3; b++) {
        kiln_tensor in = {KILN_F32, 2, {b, K}, palloc(&pool, sizeof(float) * (size_t)(b * K))}, out;
        kiln_fill_randn(in.data, b * K, (uint64_t)b);
        EXPECT(kiln_program_run(p, &in, &out) == KILN_OK, "batch %lld: %s", (long long)b,
               kiln_program_error(p));
        for (int64_t r = 0; r < b && out.data; r++)
            for (int64_t c = 0; c < N; c += 51) {
                double want = 0;
                for (int64_t k = 0; k < K; k++)
                    want += (double)((float *)in.data)[r * K + k] * w[k * N + c];
                float got = ((float *)out.data)[r * N + c];
                EXPECT(fabs(got - want) <= 1e-3 * (1 + fabs(want)), "[%lld, %lld]: %g, want %g",
                       (long long)r, (long long)c, got, want);
            }
        kiln_tensor_free(&out);
    }
    EXPECT(kiln_program_shapes(p) == 2, "%d shapes compiled", kiln_program_shapes(p));
    kiln_program_free(p);
    kiln_graph_free(g);
    remove(path);
    blocks_free(&pool);
}

/* A large f32 initializer is a graph weight from the start (no constant
 * at import), so what an exporter left unfolded on it runs in the graph:
 * Transpose and Mul of the weight, then MatMul, against the product
 * computed here; fused and interpreted; the weight as float_data and as
 * raw_data. */
static void direct_weight_case(bool raw);
TEST(onnx_direct_weight_ops) {
    direct_weight_case(false);
    direct_weight_case(true);
}

static void direct_weight_case(bool raw) {
    BlockList pool = {0};
    enum { K = 512, N = 512, B = 3 };
    int64_t ws[2] = {N, K}, xs[2] = {B, K}, ys[2] = {B, N}, one[1] = {1};
    float *w = palloc(&pool, sizeof(float) * K * N), two = 2.0f;
    kiln_fill_randn(w, K * N, 9);
    Model m = {.opset = 13, .nin = 1, .nout = 1, .ninit = 2, .nnodes = 3};
    m.in[0] = vinfo(&pool, "x", 1, 2, xs);
    m.out[0] = vinfo(&pool, "y", 1, 2, ys);
    m.init[0] = tensor(&pool, "w", 2, ws, w, NULL); /* [N, K]: used transposed */
    if (raw) { /* the same values as little-endian bytes, as exporters write them */
        m.init[0]->has_raw_data = 1;
        m.init[0]->raw_data.len = sizeof(float) * K * N;
        m.init[0]->raw_data.data = (uint8_t *)m.init[0]->float_data;
        m.init[0]->n_float_data = 0;
    }
    m.init[1] = tensor(&pool, "two", 1, one, &two, NULL);
    m.nodes[0] = node(&pool, "Transpose", "w", "wt", NULL);
    m.nodes[1] = node(&pool, "Mul", "wt two", "w2", NULL);
    m.nodes[2] = node(&pool, "MatMul", "x w2", "y", NULL);
    kiln_graph *g = kiln_graph_new();
    CHECKF(import(g, &pool, &m, 0, NULL, NULL) == KILN_OK, "%s", kiln_error(g));
    float *x = palloc(&pool, sizeof(float) * B * K), *want = palloc(&pool, sizeof(float) * B * N);
    kiln_fill_randn(x, B * K, 10);
    for (int r = 0; r < B; r++)
        for (int c = 0; c < N; c++) {
            double acc = 0;
            for (int k = 0; k < K; k++) acc += (double)x[r * K + k] * 2.0 * w[c * K + k];
            want[r * N + c] = (float)acc;
        }
    kiln_tensor in = {KILN_F32, 2, {B, K}, x}, out[2] = {{0}, {0}};
    kiln_program *p = NULL;
    CHECKF(kiln_compile(g, 1, &p) == KILN_OK, "%s", kiln_error(g));
    bool ran =
        kiln_program_run(p, &in, &out[0]) == KILN_OK && kiln_interpret(g, &in, &out[1]) == KILN_OK;
    EXPECT(ran, "run: %s %s", kiln_program_error(p), kiln_error(g));
    for (int r = 0; ran && r < 2; r++) /* sums of 512 products in f32: the models' tolerance */
        for (int64_t k = 0; k < B * N; k++) {
            float got = ((float *)out[r].data)[k];
            if (fabsf(got - want[k]) > 1e-4f + 1e-3f * fabsf(want[k])) {
                EXPECT(false, "%s (%s): element %lld is %g, want %g", r ? "interpreted" : "fused",
                       raw ? "raw_data" : "float_data", (long long)k, got, want[k]);
                break;
            }
        }
    kiln_tensor_free(&out[0]);
    kiln_tensor_free(&out[1]);
    kiln_program_free(p);
    kiln_graph_free(g);
    blocks_free(&pool);
}

/* ---- control flow as compiled sub-programs ----------------------------------- */

/* Whether the graph holds a call of sub-programs labelled `label`. */
static bool has_call(const kiln_graph *g, const char *label) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return false;
    kiln_graph_dump(g, f);
    fclose(f);
    bool found = text && strstr(text, "= call(") && strstr(text, label);
    free(text);
    return found;
}

static float max_diff(const kiln_tensor *a, const kiln_tensor *b) {
    int64_t n = kiln_tensor_numel(a);
    if (n != kiln_tensor_numel(b) || a->dtype != KILN_F32 || b->dtype != KILN_F32) return INFINITY;
    float m = 0;
    for (int64_t i = 0; i < n; i++) {
        float d = fabsf(((const float *)a->data)[i] - ((const float *)b->data)[i]);
        if (!(d <= m)) m = d;
    }
    return m;
}

static void read_pb(const char *dir, const char *file, kiln_tensor *t) {
    char path[400], err[512];
    snprintf(path, sizeof path, "tests/onnx/ops/%s/test_data_set_0/%s", dir, file);
    if (kiln_pb_read(path, t, err, sizeof err) != KILN_OK) {
        fprintf(stderr, "%s\n", err);
        memset(t, 0, sizeof *t);
    }
}

/* tests/onnx/ops/DIR's model imported with no value given (each input is
 * one the run gives), holding the call labelled call (NULL: not checked),
 * and compiled on threads; false with the reason printed. */
static bool compile_case(const char *dir, const char *call, int threads, kiln_graph **g,
                         kiln_program **p) {
    char path[300];
    snprintf(path, sizeof path, "tests/onnx/ops/%s/model.onnx", dir);
    *g = kiln_graph_new();
    *p = NULL;
    if (kiln_onnx_import(*g, path, 0, NULL, NULL) != KILN_OK)
        return printf("import: %s\n", kiln_error(*g)), false;
    if (call && !has_call(*g, call)) return printf("%s: no call %s\n", dir, call), false;
    if (kiln_compile(*g, threads, p) != KILN_OK)
        return printf("compile: %s\n", kiln_error(*g)), false;
    return true;
}

/* A Loop whose trip count is an input (not given at import): one compiled
 * body, run as many times as each run's count says, 0 included, matching
 * the interpreter, and NumPy's answer for the count the golden data has. */
TEST(onnx_loop_trip_count_at_run_time) {
    kiln_graph *g;
    kiln_program *p;
    CHECK(compile_case("loop_runtime_trips", "Loop 'n1' (node 1)", 1, &g, &p));
    kiln_tensor in[3], want;
    read_pb("loop_runtime_trips", "input_0.pb", &in[0]);
    read_pb("loop_runtime_trips", "input_1.pb", &in[1]);
    read_pb("loop_runtime_trips", "input_2.pb", &in[2]);
    read_pb("loop_runtime_trips", "output_0.pb", &want);
    CHECK(in[1].dtype == KILN_I64 && want.data);
    /* the graph holds an int64 input in f64 (exact to 2^53) */
    double count = 0;
    kiln_tensor_free(&in[1]);
    in[1] = (kiln_tensor){KILN_F64, 0, {0}, &count};
    int64_t counts[] = {7, 0, 1, 3, 7};
    for (int k = 0; k < 5; k++) {
        count = (double)counts[k];
        kiln_tensor got, ref;
        CHECKF(kiln_program_run(p, in, &got) == KILN_OK, "%s", kiln_program_error(p));
        CHECKF(kiln_interpret(g, in, &ref) == KILN_OK, "%s", kiln_error(g));
        EXPECT(max_diff(&got, &ref) < 1e-5f, "%lld trips: %g from the interpreter",
               (long long)counts[k], max_diff(&got, &ref));
        if (counts[k] == 0) /* no iteration: the start value */
            EXPECT(max_diff(&got, &in[0]) == 0, "0 trips: %g", max_diff(&got, &in[0]));
        if (counts[k] == 7)
            EXPECT(max_diff(&got, &want) < 1e-5f, "7 trips: %g from NumPy", max_diff(&got, &want));
        kiln_tensor_free(&got);
        kiln_tensor_free(&ref);
    }
    kiln_tensor_free(&in[0]);
    kiln_tensor_free(&in[2]);
    kiln_tensor_free(&want);
    kiln_program_free(p);
    kiln_graph_free(g);
}

/* An If on a bool input with a matmul in each branch: both branches
 * compiled, each run takes the one its condition picks (the then case's
 * and the else case's NumPy answers from one program). */
TEST(onnx_if_branch_at_run_time) {
    kiln_graph *g;
    kiln_program *p;
    CHECK(compile_case("if_runtime_heavy_then", "If 'n0' (node 0)", 2, &g, &p));
    const char *cases[] = {"if_runtime_heavy_then", "if_runtime_heavy_else",
                           "if_runtime_heavy_then"};
    for (int k = 0; k < 3; k++) {
        kiln_tensor in[2], want, got;
        read_pb(cases[k], "input_0.pb", &in[0]);
        read_pb(cases[k], "input_1.pb", &in[1]);
        read_pb(cases[k], "output_0.pb", &want);
        CHECK(in[1].dtype == KILN_BOOL && want.data);
        CHECKF(kiln_program_run(p, in, &got) == KILN_OK, "%s", kiln_program_error(p));
        EXPECT(max_diff(&got, &want) < 1e-5f, "%s: %g from NumPy", cases[k], max_diff(&got, &want));
        kiln_tensor_free(&got);
        for (int i = 0; i < 2; i++) kiln_tensor_free(&in[i]);
        kiln_tensor_free(&want);
    }
    kiln_program_free(p);
    kiln_graph_free(g);
}

/* Subgraphs nested past 64 deep (If in If in If ...) are refused before
 * the import walks them: a hostile model cannot exhaust the stack there. */
TEST(onnx_subgraph_nesting_bound) {
    static BlockList pools[5]; /* a pool holds 1024 blocks: 20 levels each */
    int64_t one[1] = {1};
    Onnx__GraphProto *inner = NULL;
    for (int d = 0; d < 70; d++) {
        BlockList *pool = &pools[d / 20];
        Onnx__GraphProto *br[2];
        for (int b = 1; b >= 0; b--) { /* the leaf, then the If over the level below */
            Onnx__GraphProto *g = palloc(pool, sizeof *g);
            onnx__graph_proto__init(g);
            g->name = pstr(pool, "branch");
            char out[32];
            snprintf(out, sizeof out, "o%d_%d", d, b);
            Onnx__AttributeProto **attrs = palloc(pool, sizeof(void *) * 3);
            attrs[0] = attrs[1] = attrs[2] = NULL;
            Onnx__NodeProto **nodes = palloc(pool, sizeof(void *));
            if (b == 0 && inner) {
                for (int k = 0; k < 2; k++) {
                    Onnx__AttributeProto *a = palloc(pool, sizeof *a);
                    onnx__attribute_proto__init(a);
                    a->name = pstr(pool, k ? "else_branch" : "then_branch");
                    a->has_type = 1;
                    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH;
                    a->g = k ? br[1] : inner; /* then: the level below; else: a leaf */
                    attrs[k] = a;
                }
                nodes[0] = node(pool, "If", "c", out, attrs);
            } else
                nodes[0] = node(pool, "Identity", "x", out, NULL);
            g->n_node = 1;
            g->node = nodes;
            g->n_output = 1;
            g->output = palloc(pool, sizeof(void *));
            g->output[0] = vinfo(pool, out, 1, 1, one);
            br[b] = g;
        }
        inner = br[0];
        (void)br[1];
    }
    Model md = {.opset = 13, .nnodes = 1, .nin = 2, .nout = 1};
    Onnx__AttributeProto **attrs = palloc(&pools[4], sizeof(void *) * 3);
    for (int k = 0; k < 2; k++) {
        Onnx__AttributeProto *a = palloc(&pools[4], sizeof *a);
        onnx__attribute_proto__init(a);
        a->name = pstr(&pools[4], k ? "else_branch" : "then_branch");
        a->has_type = 1;
        a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH;
        a->g = inner; /* (only the count of levels matters: never converted) */
        attrs[k] = a;
    }
    attrs[2] = NULL;
    md.nodes[0] = node(&pools[4], "If", "c", "y", attrs);
    md.in[0] = vinfo(&pools[4], "x", 1, 1, one);
    md.in[1] = vinfo(&pools[4], "c", 9, 0, one);
    md.out[0] = vinfo(&pools[4], "y", 1, 1, one);
    kiln_graph *g = kiln_graph_new();
    EXPECT(import(g, &pools[4], &md, 0, NULL, NULL) == KILN_ERR_INPUT &&
               has_text(g, "unsupported: subgraphs nested more than 64 deep"),
           "%s", kiln_error(g));
    kiln_graph_free(g);
    for (int k = 0; k < 5; k++) blocks_free(&pools[k]);
}

/* An If whose else branch does not import at these shapes: the program
 * compiles with the then branch, a run that takes it gives NumPy's answer,
 * and a run that takes the else branch fails saying why, compiled and
 * interpreted. */
TEST(onnx_if_refused_branch) {
    kiln_graph *g;
    kiln_program *p;
    CHECK(compile_case("if_branch_refused", NULL, 1, &g, &p));
    kiln_tensor in[2], want, got;
    read_pb("if_branch_refused", "input_0.pb", &in[0]);
    read_pb("if_branch_refused", "input_1.pb", &in[1]);
    read_pb("if_branch_refused", "output_0.pb", &want);
    CHECK(in[1].dtype == KILN_BOOL && want.data);
    CHECKF(kiln_program_run(p, in, &got) == KILN_OK, "%s", kiln_program_error(p));
    EXPECT(max_diff(&got, &want) < 1e-5f, "then: %g from NumPy", max_diff(&got, &want));
    kiln_tensor_free(&got);
    ((unsigned char *)in[1].data)[0] = 0;
    EXPECT(kiln_program_run(p, in, &got) == KILN_ERR_INPUT &&
               strstr(kiln_program_error(p), "If 'n0' (node 0): the condition takes the "
                                             "else_branch, which kiln refused:"),
           "%s", kiln_program_error(p));
    EXPECT(kiln_interpret(g, in, &got) == KILN_ERR_INPUT &&
               strstr(kiln_error(g), "the condition takes the else_branch, which kiln refused:"),
           "%s", kiln_error(g));
    for (int i = 0; i < 2; i++) kiln_tensor_free(&in[i]);
    kiln_tensor_free(&want);
    kiln_program_free(p);
    kiln_graph_free(g);
}

/* Slices at the iteration number in a body run at run time: x[i-5:i-4]
 * (counted from the end) and y[:, i:i+1] are gathers of a start computed
 * each iteration. 4 trips match NumPy, 0 trips give the start values, and
 * a fifth trip, x[-1:0], empty in ONNX, is an error, not a wrong row. */
TEST(onnx_loop_slices_at_run_time) {
    kiln_graph *g;
    kiln_program *p;
    CHECK(compile_case("loop_runtime_slices", "Loop 'n0' (node 0)", 1, &g, &p));
    kiln_tensor in[3], want[2];
    read_pb("loop_runtime_slices", "input_0.pb", &in[0]);
    read_pb("loop_runtime_slices", "input_1.pb", &in[1]);
    read_pb("loop_runtime_slices", "output_0.pb", &want[0]);
    read_pb("loop_runtime_slices", "output_1.pb", &want[1]);
    double count = 4;
    in[2] = (kiln_tensor){KILN_F64, 0, {0}, &count};
    kiln_tensor got[2], ref[2];
    CHECKF(kiln_program_run(p, in, got) == KILN_OK, "%s", kiln_program_error(p));
    CHECKF(kiln_interpret(g, in, ref) == KILN_OK, "%s", kiln_error(g));
    for (int k = 0; k < 2; k++) {
        EXPECT(max_diff(&got[k], &want[k]) < 1e-5f, "output %d: %g from NumPy", k,
               max_diff(&got[k], &want[k]));
        EXPECT(max_diff(&ref[k], &want[k]) < 1e-5f, "interpreted %d: %g from NumPy", k,
               max_diff(&ref[k], &want[k]));
        kiln_tensor_free(&got[k]);
        kiln_tensor_free(&ref[k]);
    }
    count = 0;
    CHECKF(kiln_program_run(p, in, got) == KILN_OK, "%s", kiln_program_error(p));
    for (int k = 0; k < 2; k++) {
        float m = 0;
        for (int64_t i = 0; i < kiln_tensor_numel(&got[k]); i++)
            m = fmaxf(m, fabsf(((float *)got[k].data)[i]));
        EXPECT(m == 0, "0 trips: output %d is not the zeros it starts from (%g)", k, m);
        kiln_tensor_free(&got[k]);
    }
    count = 5;
    EXPECT(kiln_program_run(p, in, got) == KILN_ERR_INPUT &&
               strstr(kiln_program_error(p), "out of range"),
           "5 trips: %s", kiln_program_error(p));
    for (int i = 0; i < 2; i++) kiln_tensor_free(&in[i]), kiln_tensor_free(&want[i]);
    kiln_program_free(p);
    kiln_graph_free(g);
}
