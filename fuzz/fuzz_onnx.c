/*
 * fuzz_onnx.c -- libFuzzer harness for the ONNX importer (make fuzz-onnx).
 *
 * Each input is imported as a model (kiln_onnx_import_buffer). A model
 * that imports must come out as a graph the reference interpreter can run
 * on generated inputs (or refuse with a message); one that does not import
 * must come with a message. The sanitizers report anything else. The seed
 * corpus is the models of tests/onnx and, when installed, a sample of
 * libonnx-testdata's.
 */
#include "kiln.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    setenv("KILN_MEM_LIMIT", "256M", 1);
    return 0;
}

/* Run the interpreter on zero inputs of the declared shapes. */
static void interpret(kiln_graph *g) {
    int ni = kiln_num_inputs(g), no = kiln_num_outputs(g);
    kiln_tensor *in = calloc((size_t)ni + 1, sizeof *in),
                *out = calloc((size_t)no + 1, sizeof *out);
    int ok = in && out;
    for (int i = 0; ok && i < ni; i++) {
        in[i] = kiln_input_desc(g, i);
        ok = kiln_tensor_numel(&in[i]) <= (1 << 20) && kiln_tensor_alloc(&in[i]) == KILN_OK;
        if (ok)
            memset(in[i].data, 0, (size_t)kiln_tensor_numel(&in[i]) * kiln_dtype_size(in[i].dtype));
    }
    if (ok && kiln_interpret(g, in, out) != KILN_OK && !kiln_error(g)[0]) abort();
    for (int i = 0; in && i < ni; i++) kiln_tensor_free(&in[i]);
    for (int i = 0; out && i < no; i++) kiln_tensor_free(&out[i]);
    free(in);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kiln_graph *g = kiln_graph_new();
    if (!g) return 0;
    kiln_status st = kiln_onnx_import_buffer(g, data, size, "fuzz.onnx", 0, NULL, NULL);
    if (st != KILN_OK && !kiln_error(g)[0]) abort(); /* a failure without a message */
    if (st == KILN_OK) interpret(g);
    kiln_graph_free(g);
    return 0;
}
