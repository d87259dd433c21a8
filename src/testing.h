/*
 * testing.h -- the test hooks: ways for tests and benchmarks to reach
 * inside the library that users have no business with.
 *
 * They exist only in the test build: the files that hold them compile them
 * under -DKILN_TESTING into build/libkiln_testing.a, which test_kiln and
 * the benchmarks that need a hook link; libkiln.a and the kiln command have
 * none. This header sits above every stage folder (like the tests
 * themselves) and is included by the library only inside #ifdef
 * KILN_TESTING, beside each hook's definition.
 */
#ifndef KILN_TESTING_H
#define KILN_TESTING_H

#ifndef KILN_TESTING
#error "testing.h is for the test build (-DKILN_TESTING); the library has no hooks without it"
#endif

#include "externs/externs.h"

/* runtime.c: the extern kernels every run calls (process-wide; NULL: the
 * library's), e.g. to hand epilogues ranges the library never would. The
 * table is copied; an entry left NULL is the library's (conv2d_const: the
 * table's conv2d). */
void rt_set_externs(const KilnRT *rt);

/* conv.c: conv2d's backend (process-wide): oneDNN (conv_dnnl.c, the
 * default; a shape it declines goes to im2col) or kiln's own im2col +
 * sgemm, direct 1x1 and depthwise loops. */
void ext_set_conv_backend(ExtConvBackend b);

/* matmul.c: rows per matmul block when there is an epilogue, so small
 * matrices still cross block boundaries (process-wide; 0: the policy). */
void ext_set_epilogue_rows(int64_t rows);

/* matmul_dnnl.c: how a constant-B product runs where oneDNN leaves B
 * plain (process-wide): 0 the fastest of the three below, timed on its
 * first call (the default); 1 oneDNN, B plain; 2 oneDNN, B transposed; 3
 * OpenBLAS's sgemm on B's plain copy (a single 2-D product; a batched one
 * stays plain). Also drops the cached primitives, so that the next calls
 * choose again. */
void ext_set_mm_layout(int mode);

/* jit.c: kernels of at least this many bytes of C compile as two
 * translation units in parallel (process-wide; 0: the default, 8 KiB). */
void jit_set_split_min(size_t bytes);

/* jit.c: SHA-256 of data as 64 lowercase hex digits, the hash the JIT
 * cache keys on (checked against the FIPS 180-4 examples). */
void jit_sha256_hex(const void *data, size_t n, char out[65]);

#endif
