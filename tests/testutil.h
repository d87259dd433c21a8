/* testutil.h -- helpers several test files share (testutil.c). */
#ifndef KILN_TESTUTIL_H
#define KILN_TESTUTIL_H
#include <stdbool.h>
#include "externs/externs.h"
#include "kiln.h"

/* A whole file as a NUL-terminated malloc'd string, or NULL. */
char *test_read_text(const char *path);
/* Write source to <tmp>/<name>.c and compile it with the JIT's flags and
 * GCC's optimization report; c and o receive the source and object paths,
 * *report the report (free it). 0, or -1 when it could not compile. */
int test_compile_report(const char *name, const char *source, char c[600], char o[600],
                        char **report);
/* The same with the tier flags given (test_tier_flags) instead of the
 * default tier's. */
int test_compile_report_with(const char *name, const char *source, const char *flags, char c[600],
                             char o[600], char **report);
/* The compiler flags of tier TGT_V2 .. TGT_NATIVE as if this CPU could run
 * it: for compile-only checks (vectorization) of every tier. */
const char *test_tier_flags(int tier);
/* The compiler test_compile_report* run (NULL: $CC, else cc): a cross
 * compiler for the ARM check. */
extern const char *test_cc_override;
/* Does the report say the loop at file:line (within one line) was
 * vectorized? allow_libcall also accepts a loop GCC turned into a library
 * call (a copy loop becomes memcpy). */
bool test_vectorized_at(const char *report, const char *file, int line, bool allow_libcall);
/* A program under test: its graph, random runtime inputs, and the compiled
 * program with its outputs (got) and the interpreter's (want), when used. */
#define TEST_MAXIO 24
typedef struct {
    kiln_graph *g;
    int nin;
    kiln_tensor in[TEST_MAXIO];
    kiln_program *p;
    kiln_tensor got[TEST_MAXIO], want[TEST_MAXIO];
} TestProg;
/* Declare the f32 input P->nin of P's graph and fill it with random normal
 * data from seed_base + its index. KILN_NONE (or the builder's error) when
 * that fails. */
kiln_value test_prog_input(TestProg *P, const char *name, int rank, const int64_t *shape,
                           uint64_t seed_base);
/* Frees the inputs, the program and its outputs (when P->p is set), and the graph. */
void test_prog_free(TestProg *P);
/* A compile-time constant of random normal values from seed. */
kiln_value test_random_weight(kiln_graph *g, const char *name, int rank, const int64_t *shape,
                              uint64_t seed);
/* A dense C-order view of shape. */
ExtView test_dense_view(int rank, const int64_t *shape);
/* Compile g with options o (NULL: the defaults) into *p, with the JIT
 * cache in <test_tmpdir()>/<cache>; KILN_CACHE_DIR is restored after. */
kiln_status test_compile_in_cache(kiln_graph *g, const char *cache, const kiln_options *o,
                                  kiln_program **p);
/* Compile P (as test_compile_in_cache), run it fused and interpreted and
 * compare every output within rt_tolerance; outputs named in `exact`
 * (comma-separated, NULL: none) must match bit for bit. Failures are
 * recorded; false when any. */
bool test_prog_check(TestProg *P, const char *cache, const kiln_options *o, const char *exact);
/* Compile into the suite's shared JIT cache ($KILN_TEST_CACHE_DIR), else
 * into this run's own under test_tmpdir(): sets KILN_CACHE_DIR. */
void test_use_shared_cache(void);

#endif
