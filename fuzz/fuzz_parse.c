/*
 * fuzz_parse.c -- libFuzzer harness for the .kiln parser (make fuzz-parse).
 *
 * Each input is a program's text. It is parsed into a fresh graph and the
 * graph freed; a program that parses and stays small (every node at most
 * 4096 elements, no extern op, at most 256 nodes) is also run by the
 * reference interpreter on zero inputs, so the parser's graphs are checked
 * end to end. The sanitizers (ASan, UBSan, LeakSanitizer) report anything
 * else than a clean status and message.
 *
 * KILN_MEM_LIMIT is set before the first allocation: a program may declare
 * a weight of any size (randn fills it), and the limit turns that into the
 * out-of-memory error a user would see instead of a slow run or a crash.
 * Weight files (file("...")) resolve against the working directory.
 */
#include "ref/ref.h"
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    setenv("KILN_MEM_LIMIT", "256M", 1);
    return 0;
}

/* Small enough to interpret in well under a millisecond. */
static int small(const kiln_graph *g) {
    if (g->n > 256) return 0;
    for (int i = 0; i < g->n; i++) {
        const Node *n = graph_node(g, i);
        if (op_info[n->op].kind == KIND_EXTERN) return 0;
        int64_t k = node_numel(n);
        if (k < 0 || k > 4096) return 0;
    }
    return 1;
}

static void interpret(kiln_graph *g) {
    int nin = kiln_num_inputs(g), nout = kiln_num_outputs(g);
    kiln_tensor *in = calloc((size_t)nin + 1, sizeof *in);
    kiln_tensor *out = calloc((size_t)nout + 1, sizeof *out);
    int ok = in && out;
    for (int i = 0; ok && i < nin; i++) {
        in[i] = kiln_input_desc(g, i);
        ok = kiln_tensor_alloc(&in[i]) == KILN_OK;
        if (ok)
            memset(in[i].data, 0, (size_t)kiln_tensor_numel(&in[i]) * kiln_dtype_size(in[i].dtype));
    }
    if (ok && kiln_interpret(g, in, out) == KILN_OK)
        for (int i = 0; i < nout; i++) kiln_tensor_free(&out[i]);
    for (int i = 0; in && i < nin; i++) kiln_tensor_free(&in[i]);
    free(in);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *src = malloc(size + 1);
    if (!src) return 0;
    memcpy(src, data, size);
    src[size] = '\0';
    kiln_graph *g = kiln_graph_new();
    if (g && kiln_parse(g, src, "fuzz.kiln") == KILN_OK) {
        if (small(g)) interpret(g);
    } else if (g && !kiln_error(g)[0]) {
        abort(); /* a failure must say why */
    }
    kiln_graph_free(g);
    free(src);
    return 0;
}
