/*
 * test_hugepage.c -- kiln_program_run's large fresh outputs are advised
 * MADV_HUGEPAGE (src/runtime/runtime.c), so they fault in as 2 MiB pages, and the
 * results are still right.
 *
 * The advice shows in /proc/self/smaps as the "hg" VmFlag of the mapping
 * that holds the output, whether or not the kernel then finds huge pages,
 * so the check does not depend on memory fragmentation. Skipped where
 * there is no /proc/self/smaps (not Linux).
 */
#include "test.h"
#include "testutil.h"

/* The VmFlags line of the smaps entry whose range holds addr, in *flags;
 * 0 if none found (or no smaps). */
static int smaps_flags(const void *addr, char *flags, size_t len) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return 0;
    char line[512];
    int inside = 0, found = 0;
    uintptr_t a = (uintptr_t)addr;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
            inside = a >= lo && a < hi;
        else if (inside && !strncmp(line, "VmFlags:", 8)) {
            snprintf(flags, len, "%s", line + 8);
            found = 1;
        }
    }
    fclose(f);
    return found;
}

TEST(hugepage_fresh_outputs_advised_and_right) {
    test_use_shared_cache();
    kiln_graph *g = kiln_graph_new();
    /* a 16 MiB output, above runtime.c's 4 MiB threshold */
    CHECKF(kiln_parse(g, "input x: f32[2048, 2048]\ny = relu(x + 1)\noutput y\n", "huge.kiln") ==
               KILN_OK,
           "%s", kiln_error(g));
    kiln_tensor in = kiln_input_desc(g, 0), out, ref;
    CHECK(kiln_tensor_alloc(&in) == KILN_OK);
    kiln_fill_randn(in.data, kiln_tensor_numel(&in), 11);
    kiln_program *p = NULL;
    CHECKF(kiln_compile(g, 1, &p) == KILN_OK, "%s", kiln_error(g));
    CHECKF(kiln_program_run(p, &in, &out) == KILN_OK, "%s", kiln_program_error(p));
    CHECK(kiln_interpret(g, &in, &ref) == KILN_OK);
    size_t bytes = (size_t)kiln_tensor_numel(&out) * sizeof(float);
    EXPECT(!memcmp(out.data, ref.data, bytes), "relu(x + 1) differs from the interpreter");
    char flags[512] = "";
    if (smaps_flags((const char *)out.data + bytes / 2, flags, sizeof flags))
        EXPECT(strstr(flags, " hg") != NULL, "output not advised MADV_HUGEPAGE; VmFlags:%s", flags);
    else
        printf("hugepage: no /proc/self/smaps, advice not checked\n");
    kiln_tensor_free(&out);
    kiln_tensor_free(&ref);
    kiln_tensor_free(&in);
    kiln_program_free(p);
    kiln_graph_free(g);
}
