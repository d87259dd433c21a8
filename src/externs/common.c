/*
 * common.c -- what every library kernel shares, below the kernels
 * themselves (matmul.c, conv.c, conv1x1.c, conv_dnnl.c, gather.c,
 * conv_transpose.c) so none of them reaches into another:
 *
 *   the CPU's features and the target tier's cap on them (a program
 *   compiled for v3 runs no AVX-512 instruction in a library kernel either),
 *   running an extern's fused epilogue on the blocks of its output,
 *   and the lists of kept (reordered or packed) copies of constant weights,
 *   which the backends fill and ext_kept_forget_all empties.
 */
#include "externs/externs.h"
#include <omp.h>
#include <pthread.h>

/* ---- the CPU and the tier ---------------------------------------------------- */

/* This CPU's features, as the OS lets programs use them (target.c reads
 * cpuid and XCR0 for the AVX and AVX-512 state). */
unsigned ext_cpu_features_all(void) { return tgt_ext_of(tgt_cpu_features()); }

int ext_isa_level(unsigned f) { return (f & EXT_CPU_AVX512) ? 2 : (f & EXT_CPU_AVX2) ? 1 : 0; }

/* The cap of the program running on this thread (ext_isa_enter); ~0u
 * outside a run: whatever the CPU has. */
static _Thread_local unsigned isa_cap = ~0u;

unsigned ext_isa_cap(void) { return isa_cap; }

unsigned ext_isa_enter(unsigned cap) {
    unsigned prev = isa_cap;
    isa_cap = cap;
    return prev;
}

void ext_isa_leave(unsigned prev) { isa_cap = prev; }

unsigned ext_cpu_features(void) { return ext_cpu_features_all() & isa_cap; }

/* ---- epilogues --------------------------------------------------------------
 *
 * How big a block, and who runs it. BLAS is a black box: a block of rows is
 * one cblas_sgemm on the sub-matrix, and every call packs all of B again
 * and pays its set-up, so small blocks are expensive, while a second pass
 * over C still in cache is cheap (docs/decisions.md: Matmul epilogue
 * blocks). Blocks sized to the L2 (256 KiB of C: 32 rows
 * at n = 2048) would cost more than they save, so a block is
 * EXT_EPI_BLOCK_BYTES of C (it stays in the last-level cache; a C that fits
 * is one block and one call, exactly as without an epilogue), and at least
 * EXT_EPI_MIN_ROWS rows. Blocking pays where C is larger than the cache,
 * and most for a skinny K, where the library's own write of C is the cost:
 * the epilogue then reads each block from cache instead of memory.
 *
 * Threads: blocks run one after another with BLAS threading inside each
 * sgemm, and the epilogue of a block runs on every thread in pieces of
 * whole rows. The alternative, blocks in parallel each with a one-thread
 * sgemm, makes every thread pack all of B for its block (T times the
 * packing OpenBLAS's threaded sgemm shares among its threads), and its
 * blocks are M/T rows, small and so expensive for many threads; it also
 * leaves threads idle when M is not a multiple of the block.
 * Convolution slabs are fixed by im2col (one sgemm per image and group) and
 * get the same treatment; depthwise planes are computed in parallel and
 * each thread runs the epilogue of its plane. */

/* Run epi over elements [start, start + count) of c, whose rows (or planes)
 * are `unit` elements: serially when small, else in pieces of whole units
 * shared among the threads. Called outside any parallel region. */
void ext_run_epilogue(ExtEpilogue epi, void *ctx, float *c, int64_t start, int64_t count,
                      int64_t unit) {
    if (!epi || count <= 0) return;
    if (count < EXT_EPI_PARALLEL_MIN) {
        epi(ctx, c, start, count);
        return;
    }
    int64_t per = unit * ((EXT_EPI_PIECE + unit - 1) / unit), n = (count + per - 1) / per;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        int64_t s = start + i * per, e = s + per < start + count ? s + per : start + count;
        epi(ctx, c, s, e - s);
    }
}

/* The epilogue of nslabs consecutive slabs of `slab` elements (an image's
 * groups), each called within its own slab: large slabs one after another,
 * each on every thread; small ones shared among the threads. */
void ext_run_epilogue_slabs(ExtEpilogue epi, void *ctx, float *c, int64_t start, int64_t nslabs,
                            int64_t slab, int64_t unit) {
    if (!epi) return;
    if (nslabs == 1 || slab >= EXT_EPI_PARALLEL_MIN) {
        for (int64_t i = 0; i < nslabs; i++)
            ext_run_epilogue(epi, ctx, c, start + i * slab, slab, unit);
        return;
    }
#pragma omp parallel for schedule(static) if (nslabs * slab >= EXT_EPI_PARALLEL_MIN)
    for (int64_t i = 0; i < nslabs; i++) epi(ctx, c, start + i * slab, slab);
}

/* ---- kept copies of constant weights ------------------------------------------ */

/* Every list a backend ever added to, pushed once without a lock (lists
 * are static and never leave): ext_kept_forget_all and ext_kept_count_all
 * walk them without knowing the backends. */
static ExtKeptList *kept_lists;

static void kept_register(ExtKeptList *l) {
    if (__atomic_exchange_n(&l->registered, true, __ATOMIC_ACQ_REL)) return;
    ExtKeptList *head = __atomic_load_n(&kept_lists, __ATOMIC_ACQUIRE);
    do l->next_list = head;
    while (!__atomic_compare_exchange_n(&kept_lists, &head, l, true, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE));
}

void ext_kept_add(ExtKeptList *l, ExtKept *e) {
    kept_register(l);
    e->next = l->head;
    l->head = e;
    l->bytes += e->bytes;
}

void ext_kept_free(ExtKept *e) {
    kfree(e->raw);
    kfree(e);
}

void ext_kept_forget(ExtKeptList *l, const void *data, size_t bytes) {
    const char *lo = data, *hi = lo + bytes;
    pthread_mutex_lock(l->lock);
    for (ExtKept **pe = &l->head; *pe;) {
        ExtKept *e = *pe;
        if ((const char *)e->w < lo || (const char *)e->w >= hi) {
            pe = &e->next;
            continue;
        }
        *pe = e->next;
        l->bytes -= e->bytes;
        ext_kept_free(e);
    }
    pthread_mutex_unlock(l->lock);
}

int ext_kept_stats(ExtKeptList *l, size_t *bytes) {
    int n = 0;
    pthread_mutex_lock(l->lock);
    for (const ExtKept *e = l->head; e; e = e->next) n++;
    if (bytes) *bytes = l->bytes;
    pthread_mutex_unlock(l->lock);
    return n;
}

void ext_kept_forget_all(const void *data, size_t bytes) {
    for (ExtKeptList *l = __atomic_load_n(&kept_lists, __ATOMIC_ACQUIRE); l; l = l->next_list)
        ext_kept_forget(l, data, bytes);
}

int ext_kept_count_all(size_t *bytes) {
    int n = 0;
    size_t total = 0, b;
    for (ExtKeptList *l = __atomic_load_n(&kept_lists, __ATOMIC_ACQUIRE); l; l = l->next_list) {
        n += ext_kept_stats(l, &b);
        total += b;
    }
    if (bytes) *bytes = total;
    return n;
}
