/*
 * jit.h -- compile generated C into a shared object and load it (internal).
 *
 * jit_compile writes the source into a cache directory under a name derived
 * from a hash of everything that decides the binary (source, flags, compiler
 * command and version, CPU), runs the system C compiler once per new key
 * and dlopens the result. A later compile of the same source, in this
 * process or another, loads the cached object without running the compiler.
 *
 *   $CC (default "cc", may hold words: "ccache gcc")
 *       -O3 -fopenmp -fno-math-errno -shared -fPIC -std=c11
 *       <extra_flags> -o <dir>/<key>.so.tmp.<pid>.<n> <dir>/<key>.c -lm
 *
 * The runtime's extra flags hold the target tier's (target.h: -march=
 * x86-64-v3 -mtune=native, ...); without them the object is baseline
 * x86-64.
 *
 * -fno-math-errno lets GCC inline and vectorize sqrtf (kernels never read
 * errno); everything else that must vectorize comes from vecmath.h. No
 * -lmvec: GCC calls libmvec only under -ffast-math, which kiln avoids.
 *   cache dir: $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else
 *              $HOME/.cache/kiln (created with parents, mode 0755)
 *
 * Entries appear only by rename(), so a reader never sees a partial file and
 * concurrent compilers of one key all succeed (the last rename wins, with
 * identical content). An entry that does not load (bad ELF magic, dlopen
 * fails, or the marker symbol kiln_jit_marker_<key> is missing) is deleted
 * and rebuilt once.
 */
#ifndef KILN_JIT_H
#define KILN_JIT_H

#include "kiln.h"
#include <stddef.h>

typedef struct JitLib JitLib;   /* a loaded shared object */

typedef struct {
    int cache_hit;       /* 1: loaded from the cache, no compiler ran */
    double compile_ms;   /* wall time of the compiler run; 0 on a hit */
    char path[512];      /* the loaded .so */
    char src_path[512];  /* the cached source, kept for error reports */
} JitStats;

/* Compile (or find in the cache) and load source. extra_flags (NULL or "")
 * are appended to the standard flags, split at spaces. On failure returns
 * KILN_ERR_ENV (no compiler, compile error with the compiler's stderr and
 * the kept source path, cache directory unusable, dlopen failed) or
 * KILN_ERR_NOMEM, with a message in err. stats may be NULL. */
kiln_status jit_compile(const char *source, const char *extra_flags, JitLib **out,
                        char *err, size_t errlen, JitStats *stats);
/* The address of an exported symbol, or NULL. */
void *jit_sym(JitLib *lib, const char *name);
/* Unload (dlclose) and free; NULL is fine. Symbols must not be used after. */
void jit_close(JitLib *lib);

/* SHA-256 of data as 64 lowercase hex digits (the cache key uses the first
 * 32). Exported for its test. */
void jit_sha256_hex(const void *data, size_t n, char out[65]);

#endif
