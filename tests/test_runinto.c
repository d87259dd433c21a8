/*
 * test_runinto.c -- kiln_program_run_into: the compiled program writes into
 * outputs the caller allocated once, and gives the same values as
 * kiln_program_run and the interpreter.
 */
#include "test.h"
#include "testutil.h"

static kiln_graph *program(void) {
    test_use_shared_cache();
    kiln_graph *g = kiln_graph_new();
    const char *src = "input x: f32[37, 129]\n"
                      "y = softmax(x * 2, dim=1)\n"
                      "m = amax(x, dim=1) > 1\n"
                      "output y, m\n";
    if (kiln_parse(g, src, "runinto.kiln") != KILN_OK) printf("  %s\n", kiln_error(g));
    return g;
}

TEST(runinto_matches_run_and_interpreter) {
    kiln_graph *g = program();
    kiln_tensor in = kiln_input_desc(g, 0), fresh[2], mine[2], ref[2];
    CHECK(kiln_tensor_alloc(&in) == KILN_OK);
    kiln_fill_randn(in.data, kiln_tensor_numel(&in), 5);
    kiln_program *p = NULL;
    CHECKF(kiln_compile(g, 1, &p) == KILN_OK, "%s", kiln_error(g));
    CHECK(kiln_program_run(p, &in, fresh) == KILN_OK);
    CHECK(kiln_interpret(g, &in, ref) == KILN_OK);
    for (int i = 0; i < 2; i++) {
        mine[i] = kiln_output_desc(g, i);
        CHECK(kiln_tensor_alloc(&mine[i]) == KILN_OK);
    }
    for (int round = 0; round < 2; round++) { /* the same memory twice */
        CHECKF(kiln_program_run_into(p, &in, mine) == KILN_OK, "%s", kiln_program_error(p));
        for (int i = 0; i < 2; i++) {
            size_t bytes = (size_t)kiln_tensor_numel(&mine[i]) * kiln_dtype_size(mine[i].dtype);
            EXPECT(!memcmp(mine[i].data, fresh[i].data, bytes), "output %d differs from run", i);
        }
    }
    const float *y = mine[0].data, *r = ref[0].data;
    for (int64_t k = 0; k < kiln_tensor_numel(&mine[0]); k++)
        EXPECT(fabsf(y[k] - r[k]) <= 1e-5f + 1e-4f * fabsf(r[k]), "y[%lld] %g vs %g", (long long)k,
               y[k], r[k]);
    EXPECT(!memcmp(mine[1].data, ref[1].data, 37), "bool output m differs from the interpreter");
    for (int i = 0; i < 2; i++) {
        kiln_tensor_free(&fresh[i]);
        kiln_tensor_free(&mine[i]);
        kiln_tensor_free(&ref[i]);
    }
    kiln_tensor_free(&in);
    kiln_program_free(p);
    kiln_graph_free(g);
}

TEST(runinto_rejects_wrong_outputs) {
    kiln_graph *g = program();
    kiln_tensor in = kiln_input_desc(g, 0), out[2];
    CHECK(kiln_tensor_alloc(&in) == KILN_OK);
    kiln_fill_randn(in.data, kiln_tensor_numel(&in), 6);
    kiln_program *p = NULL;
    CHECKF(kiln_compile(g, 1, &p) == KILN_OK, "%s", kiln_error(g));
    for (int i = 0; i < 2; i++) {
        out[i] = kiln_output_desc(g, i);
        CHECK(kiln_tensor_alloc(&out[i]) == KILN_OK);
    }
    out[0].shape[1] = 128; /* wrong shape */
    EXPECT(kiln_program_run_into(p, &in, out) == KILN_ERR_INPUT, "wrong shape accepted");
    EXPECT(strstr(kiln_program_error(p), "output 'y': expected memory for f32[37, 129]") != NULL,
           "message: %s", kiln_program_error(p));
    out[0].shape[1] = 129;
    void *keep = out[1].data;
    out[1].data = NULL; /* no memory */
    EXPECT(kiln_program_run_into(p, &in, out) == KILN_ERR_INPUT, "NULL data accepted");
    EXPECT(strstr(kiln_program_error(p), "output 'm'") != NULL, "message: %s",
           kiln_program_error(p));
    out[1].data = keep;
    EXPECT(kiln_program_run_into(p, &in, out) == KILN_OK, "%s", kiln_program_error(p));
    for (int i = 0; i < 2; i++) kiln_tensor_free(&out[i]);
    kiln_tensor_free(&in);
    kiln_program_free(p);
    kiln_graph_free(g);
}
