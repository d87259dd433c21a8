/*
 * matmul_dnnl.c -- a matmul whose B is a constant weight, through oneDNN's
 * matmul with B reordered once into the blocked layout it wants.
 *
 * Why: OpenBLAS's sgemm packs B on every call, and with an epilogue a call
 * per block of rows packs it once per block: ddddocr's classifier, [40,
 * 512] @ [512, 8210], took 3.64 ms at 2 threads on a Zen 5, where oneDNN
 * with the weight blocked once takes 0.87 ms; the encoder's projections
 * and feed-forward layers 10-25% less than sgemm (docs/decisions.md:
 * Constant-weight matmuls on oneDNN).
 *
 * How: one primitive per (M, K, N, A's row stride, B's strides, threads),
 * made on first use and kept in a small cache (where oneDNN leaves B plain,
 * the first use also times B transposed and keeps the faster: mm_try);
 * B's blocked copy is kept under its address, strides and layout (ExtKept,
 * as conv_dnnl.c's weights) until the program is freed
 * (ext_kept_forget_all). A call
 * computes all of C at once, then runs the epilogue over it in pieces.
 * Concurrent calls each take an entry no other call holds (busy), making
 * another when every match is busy.
 *
 * Batches of A against the one B that do not fold into one GEMM (the
 * encoder at batch 8: A is [128, 8, 256] seen through the sequence-first
 * transpose) run as oneDNN's batched matmul, A's batch stride as it is.
 *
 * A 2-D A may also be a transpose (its columns dense: an RNN's input
 * projection of a sequence stored feature-major); matmul.c packs any
 * other 2-D A dense before calling here (dnnl_packed).
 *
 * Declined (returns 1, the caller runs OpenBLAS): A's rows not dense
 * (its column stride not 1) unless a 2-D transpose, more than one batch
 * dim above 1, oneDNN failing to make the primitive for a reason other
 * than memory. Out of memory anywhere is -1, as every extern reports it.
 */
#include "externs/externs.h"
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { K_M, K_K, K_N, K_SA, K_SAC, K_SB0, K_SB1, K_THREADS, K_BATCH, K_SBATCH, KEY_LEN };
enum { M_SRC, M_WEI_PLAIN, M_WEI, M_DST, M_PAD, M_COUNT };

typedef struct {
    int64_t key[KEY_LEN];
    dnnl_primitive_t mm, wei_in; /* wei_in: plain B -> blocked; NULL when they agree */
    dnnl_memory_t mem[M_COUNT];
    dnnl_memory_desc_t wei_md;
    size_t wei_bytes, pad_bytes;
    void *pad_raw, *pad; /* the scratchpad, 64-byte aligned */
    dnnl_stream_t stream;
    char impl[32]; /* oneDNN's implementation ("gemm:jit", "brg:avx512_core", ...) */
    bool busy, uncached;
    bool transposed; /* B's layout given as K-contiguous (ba), not left to oneDNN */
    bool tried;      /* the layouts have been timed against each other (mm_try) */
    bool blas;       /* OpenBLAS's sgemm runs it, on B's plain copy (mm_try) */
} DnnlMm;

#define CACHE_SIZE 64
static DnnlMm *cache[CACHE_SIZE];
static int cache_next;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static dnnl_engine_t engine;

static void mm_free(DnnlMm *d) {
    if (!d) return;
    dnnl_primitive_destroy(d->mm);
    dnnl_primitive_destroy(d->wei_in);
    for (int i = 0; i < M_COUNT; i++) dnnl_memory_destroy(d->mem[i]);
    dnnl_stream_destroy(d->stream);
    kfree(d->pad_raw);
    free(d);
}

static dnnl_status_t mm_make(DnnlMm *d) {
    const int64_t *k = d->key;
    /* 2-D, or batches of A against the one B: [batch, M, K] @ [1, K, N] */
    bool b3 = k[K_BATCH] > 1;
    int nd = b3 ? 3 : 2, o = b3 ? 0 : 1; /* o: the first dim used */
    dnnl_dims_t da = {k[K_BATCH], k[K_M], k[K_K]}, db = {1, k[K_K], k[K_N]};
    dnnl_dims_t dc = {k[K_BATCH], k[K_M], k[K_N]};
    dnnl_dims_t sa = {k[K_SBATCH], k[K_SA], k[K_SAC]}, sb = {k[K_K] * k[K_N], k[K_SB0], k[K_SB1]};
    dnnl_memory_desc_t src, wei, wei_any, dst;
    dnnl_status_t st = dnnl_memory_desc_init_by_strides(&src, nd, da + o, dnnl_f32, sa + o);
    if (!st) st = dnnl_memory_desc_init_by_strides(&wei, nd, db + o, dnnl_f32, sb + o);
    dnnl_format_tag_t wtag = !d->transposed ? dnnl_format_tag_any : b3 ? dnnl_acb : dnnl_ba;
    if (!st) st = dnnl_memory_desc_init_by_tag(&wei_any, nd, db + o, dnnl_f32, wtag);
    if (!st) st = dnnl_memory_desc_init_by_tag(&dst, nd, dc + o, dnnl_f32, b3 ? dnnl_abc : dnnl_ab);
    dnnl_matmul_desc_t md;
    if (!st) st = dnnl_matmul_desc_init(&md, &src, &wei_any, NULL, &dst);
    dnnl_primitive_attr_t pa = NULL;
    if (!st) st = dnnl_primitive_attr_create(&pa);
    if (!st) st = dnnl_primitive_attr_set_scratchpad_mode(pa, dnnl_scratchpad_mode_user);
    dnnl_primitive_desc_t pd = NULL;
    if (!st) st = dnnl_primitive_desc_create(&pd, &md, pa, engine, NULL);
    dnnl_primitive_attr_destroy(pa);
    if (st) return st;
    const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    const dnnl_memory_desc_t *pmd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    d->wei_md = *wmd;
    d->wei_bytes = dnnl_memory_desc_get_size(wmd);
    d->pad_bytes = pmd ? dnnl_memory_desc_get_size(pmd) : 0;
    ext_dnnl_impl_of(pd, d->impl);
    st = dnnl_primitive_create(&d->mm, pd);
    const dnnl_memory_desc_t *mds[M_COUNT] = {&src, &wei, wmd, &dst, pmd};
    for (int i = 0; i < M_COUNT && !st; i++)
        if (mds[i]) st = dnnl_memory_create(&d->mem[i], mds[i], engine, DNNL_MEMORY_NONE);
    if (!st && !dnnl_memory_desc_equal(&wei, wmd)) {
        dnnl_primitive_desc_t rpd;
        st = dnnl_reorder_primitive_desc_create(&rpd, &wei, engine, wmd, engine, NULL);
        if (!st) {
            st = dnnl_primitive_create(&d->wei_in, rpd);
            dnnl_primitive_desc_destroy(rpd);
        }
    }
    dnnl_primitive_desc_destroy(pd);
    if (!st) st = dnnl_stream_create(&d->stream, engine, dnnl_stream_default_flags);
    if (!st && d->pad_bytes) {
        if (!(d->pad_raw = kmalloc(d->pad_bytes + KILN_ALIGN - 1))) return dnnl_out_of_memory;
        d->pad = util_on_line(d->pad_raw);
        st = dnnl_memory_set_data_handle(d->mem[M_PAD], d->pad);
    }
    return st;
}

/* An entry for key that no call holds, made if need be; NULL on failure
 * (*oom: for want of memory). */
static DnnlMm *mm_take(const int64_t key[KEY_LEN], bool *oom) {
    *oom = false;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < CACHE_SIZE; i++)
        if (cache[i] && !cache[i]->busy && !memcmp(cache[i]->key, key, sizeof cache[i]->key)) {
            cache[i]->busy = true;
            pthread_mutex_unlock(&lock);
            return cache[i];
        }
    if (!engine && dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success) {
        pthread_mutex_unlock(&lock);
        return NULL;
    }
    pthread_mutex_unlock(&lock);
    DnnlMm *d = calloc(1, sizeof *d);
    if (!d) return *oom = true, NULL;
    memcpy(d->key, key, sizeof d->key);
    dnnl_status_t made = mm_make(d);
    if (made != dnnl_success) {
        *oom = made == dnnl_out_of_memory;
        mm_free(d);
        return NULL;
    }
    d->busy = true;
    pthread_mutex_lock(&lock);
    int slot = -1;
    for (int n = 0; n < CACHE_SIZE && slot < 0; n++) {
        int i = (cache_next + n) % CACHE_SIZE;
        if (!cache[i] || !cache[i]->busy) slot = i;
    }
    if (slot < 0) {
        d->uncached = true;
    } else {
        mm_free(cache[slot]);
        cache[slot] = d;
        cache_next = (slot + 1) % CACHE_SIZE;
    }
    pthread_mutex_unlock(&lock);
    return d;
}

static void mm_give(DnnlMm *d) {
    if (d->uncached) {
        mm_free(d);
        return;
    }
    pthread_mutex_lock(&lock);
    d->busy = false;
    pthread_mutex_unlock(&lock);
}

/* ---- the constant B, reordered once ---- */

typedef struct {
    ExtKept base;
    int64_t k, n, sb0, sb1;
    dnnl_memory_desc_t md;
    void *data;
} Kept;

#define KEPT_MAX ((size_t)1 << 30)
static ExtKeptList mm_kept = {.lock = &lock};

static dnnl_status_t exec(DnnlMm *d, dnnl_primitive_t p, int n, const dnnl_exec_arg_t *args) {
    dnnl_status_t st = dnnl_primitive_execute(p, d->stream, n, args);
    return st ? st : dnnl_stream_wait(d->stream);
}

/* b (plain) into to, in d's layout. */
static dnnl_status_t reorder_b(DnnlMm *d, const float *b, void *to) {
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, d->mem[M_WEI_PLAIN]}, {DNNL_ARG_TO, d->mem[M_WEI]}};
    dnnl_status_t st = dnnl_memory_set_data_handle(d->mem[M_WEI_PLAIN], (void *)b);
    if (!st) st = dnnl_memory_set_data_handle(d->mem[M_WEI], to);
    return st ? st : exec(d, d->wei_in, 2, args);
}

/* B in d's layout: kept (made now on a miss), or NULL: over KEPT_MAX (the
 * caller then reorders it into scratch of its own), or, with *oom set, out
 * of memory. */
static void *kept_b(DnnlMm *d, const float *b, bool *oom) {
    *oom = false;
    pthread_mutex_lock(&lock);
    for (ExtKept *e = mm_kept.head; e; e = e->next) {
        Kept *k = (Kept *)e;
        if (e->w == b && k->k == d->key[K_K] && k->n == d->key[K_N] && k->sb0 == d->key[K_SB0] &&
            k->sb1 == d->key[K_SB1] && dnnl_memory_desc_equal(&k->md, &d->wei_md)) {
            pthread_mutex_unlock(&lock);
            return k->data;
        }
    }
    Kept *k = NULL;
    bool fits = mm_kept.bytes + d->wei_bytes <= KEPT_MAX;
    if (fits && !(k = kmalloc(sizeof *k))) *oom = true;
    if (k) {
        *k = (Kept){.base = {.w = b, .bytes = d->wei_bytes},
                    .k = d->key[K_K],
                    .n = d->key[K_N],
                    .sb0 = d->key[K_SB0],
                    .sb1 = d->key[K_SB1],
                    .md = d->wei_md};
        k->base.raw = kmalloc(d->wei_bytes + KILN_ALIGN - 1);
        dnnl_status_t st = dnnl_out_of_memory;
        if (k->base.raw) {
            k->data = util_on_line(k->base.raw);
            st = reorder_b(d, b, k->data);
        }
        if (st) {
            *oom = st == dnnl_out_of_memory;
            ext_kept_free(&k->base);
            k = NULL;
        } else {
            ext_kept_add(&mm_kept, &k->base);
        }
    }
    pthread_mutex_unlock(&lock);
    return k ? k->data : NULL;
}

/* ---- the layout of B, tried ---- */

/* Where oneDNN leaves B plain (its gemm kernels, without AVX-512's brgemm),
 * the same product with B transposed (K-contiguous) can be twice as fast
 * or slower, by shape, and OpenBLAS's sgemm on B's plain copy faster
 * still on others: on a Zen 3, [128, 256] @ [256, 1024] took 1.66 ms with
 * B plain and 0.82 transposed, [40, 512] @ [512, 8210] 6.5 and 8.1, and
 * [20, 1024] @ [1024, 8210] 9.8 on oneDNN either way and 6.5 on OpenBLAS
 * (docs/decisions.md: Constant-weight matmuls on oneDNN). So the first call
 * of a new product times the three on its own operands (TRY_RUNS each,
 * taking turns, the best of each; OpenBLAS only for a single 2-D product)
 * and leaves the plain layout on oneDNN only for one that was faster by
 * TRY_MARGIN, so that noise does not flip a near tie. */
enum { TRY_RUNS = 3, TRY_PLAIN = 0, TRY_TRANSPOSED, TRY_BLAS, TRY_COUNT };
#define TRY_MARGIN 0.9

/* 0: time them; 1 + TRY_*: take that one (tests) */
static int try_mode;

/* The choice made for each product (see choice_put). */
typedef struct {
    int64_t key[KEY_LEN];
    int win; /* TRY_* */
} MmChoice;

/* more than the primitives cached, so that a product's choice outlives
 * its primitives (a choice forgotten could be made again differently) */
#define CHOICES (4 * CACHE_SIZE)
static MmChoice choices[CHOICES];
static int nchoices, choice_next;

#ifdef KILN_TESTING
#include "testing.h"
void ext_set_mm_layout(int mode) {
    pthread_mutex_lock(&lock);
    try_mode = mode;
    nchoices = choice_next = 0;
    for (int i = 0; i < CACHE_SIZE; i++)
        if (cache[i] && !cache[i]->busy) {
            mm_free(cache[i]);
            cache[i] = NULL;
        }
    pthread_mutex_unlock(&lock);
}
#endif

static bool b_plain(const DnnlMm *d) {
    dnnl_memory_desc_t plain;
    int nd = d->key[K_BATCH] > 1 ? 3 : 2, o = nd == 3 ? 0 : 1;
    dnnl_dims_t db = {1, d->key[K_K], d->key[K_N]};
    return !dnnl_memory_desc_init_by_tag(&plain, nd, db + o, dnnl_f32,
                                         nd == 3 ? dnnl_abc : dnnl_ab) &&
           dnnl_memory_desc_equal(&plain, &d->wei_md);
}

/* c = a @ B on d, B in d's layout at wb. */
static dnnl_status_t mm_exec(DnnlMm *d, const float *a, void *wb, float *c) {
    dnnl_memory_t wmem = d->wei_in ? d->mem[M_WEI] : d->mem[M_WEI_PLAIN];
    dnnl_status_t st = dnnl_memory_set_data_handle(d->mem[M_SRC], (void *)a);
    if (!st) st = dnnl_memory_set_data_handle(wmem, wb);
    if (!st) st = dnnl_memory_set_data_handle(d->mem[M_DST], c);
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, d->mem[M_SRC]},
                               {DNNL_ARG_WEIGHTS, wmem},
                               {DNNL_ARG_DST, d->mem[M_DST]},
                               {DNNL_ARG_SCRATCHPAD, d->mem[M_PAD]}};
    return st ? st : exec(d, d->mm, d->mem[M_PAD] ? 4 : 3, args);
}

/* c = a @ B by OpenBLAS's sgemm, B plain (K x N, row-major) at wb; a as
 * d's key has it: rows dense (K_SAC 1) or a transpose (columns dense). */
static void mm_blas(const DnnlMm *d, const float *a, const void *wb, float *c) {
    const int64_t *k = d->key;
    bool at = k[K_SAC] != 1;
    ext_blas_init();
    cblas_sgemm(CblasRowMajor, at ? CblasTrans : CblasNoTrans, CblasNoTrans, (int)k[K_M],
                (int)k[K_N], (int)k[K_K], 1.0f, a, (int)(at ? k[K_SAC] : k[K_SA]),
                (const float *)wb, (int)k[K_N], 0.0f, c, (int)k[K_N]);
}

/* The product's time in ms on d (blas: by mm_blas), or -1 when it failed. */
static double mm_time(DnnlMm *d, bool blas, const float *a, void *wb, float *c) {
    double t0 = util_now_ms();
    if (blas)
        mm_blas(d, a, wb, c);
    else if (mm_exec(d, a, wb, c))
        return -1.0;
    return util_now_ms() - t0;
}

/* The choice made for each product (its key) is shared by every entry
 * made for it: two callers running the same program at once each take an
 * entry of their own (mm_take), and these must compute the same bits, so
 * the first trial's choice is the one every later entry takes, untimed.
 * Here: the choice recorded for key, or -1 (under lock). */
static int choice_find(const int64_t key[KEY_LEN]) {
    for (int i = 0; i < nchoices; i++)
        if (!memcmp(choices[i].key, key, sizeof choices[i].key)) return choices[i].win;
    return -1;
}

/* Records win for key unless a choice is there already; returns the one
 * that stands. */
static int choice_put(const int64_t key[KEY_LEN], int win) {
    pthread_mutex_lock(&lock);
    int had = choice_find(key);
    if (had < 0) {
        MmChoice *e;
        if (nchoices < CHOICES) {
            e = &choices[nchoices++];
        } else {
            e = &choices[choice_next];
            choice_next = (choice_next + 1) % CHOICES;
        }
        memcpy(e->key, key, sizeof e->key);
        e->win = win;
    }
    pthread_mutex_unlock(&lock);
    return had < 0 ? win : had;
}

/* d (fresh, B plain) against the same product with B transposed and on
 * OpenBLAS, timed on a, b and c; d takes the transposed primitive, or its
 * blas flag, when one wins. Whatever fails here leaves d as it is: the
 * trial is only a choice. A product already chosen for (choice_find)
 * takes that choice untimed. */
static void mm_try(DnnlMm *d, const float *a, const float *b, float *c) {
    d->tried = true;
    if (!b_plain(d)) return;
    pthread_mutex_lock(&lock);
    int win = choice_find(d->key);
    pthread_mutex_unlock(&lock);
    DnnlMm *t = NULL;
    if (win < 0 || win == TRY_TRANSPOSED) {
        if (!(t = calloc(1, sizeof *t))) return;
        memcpy(t->key, d->key, sizeof t->key);
        t->transposed = true;
    }
    bool ok = !t || mm_make(t) == dnnl_success;
    if (win < 0) {
        /* B as it is where a primitive takes it so (a transposed view of B
         * for t), else reordered into raw */
        void *raw[2] = {NULL, NULL}, *wb[2] = {(void *)b, (void *)b};
        DnnlMm *both[2] = {d, t};
        for (int i = 0; i < 2 && ok; i++) {
            if (!both[i]->wei_in) continue;
            ok = (raw[i] = kmalloc(both[i]->wei_bytes + KILN_ALIGN - 1)) != NULL;
            if (ok) ok = reorder_b(both[i], b, wb[i] = util_on_line(raw[i])) == dnnl_success;
        }
        /* OpenBLAS on d's plain copy, for one 2-D product (a batch would
         * pack B once per batch) */
        int tries = d->key[K_BATCH] == 1 ? TRY_COUNT : TRY_BLAS;
        double best[TRY_COUNT];
        for (int i = 0; i < TRY_COUNT; i++)
            best[i] = !try_mode ? 1e30 : i == try_mode - 1 ? 0.0 : 1.0;
        for (int r = 0; r < TRY_RUNS && ok && !try_mode; r++)
            for (int i = 0; i < tries && ok; i++) {
                int on = i == TRY_BLAS ? TRY_PLAIN : i;
                double ms = mm_time(both[on], i == TRY_BLAS, a, wb[on], c);
                ok = ms >= 0;
                if (ok && ms < best[i]) best[i] = ms;
            }
        win = TRY_PLAIN;
        for (int i = 1; i < tries && ok; i++)
            if (best[i] < TRY_MARGIN * best[TRY_PLAIN] && best[i] < best[win]) win = i;
        kfree(raw[0]);
        kfree(raw[1]);
        if (ok) win = choice_put(d->key, win);
    }
    if (ok && win == TRY_BLAS) {
        d->blas = true;
        util_fmt(d->impl, sizeof d->impl, "OpenBLAS sgemm (faster here)");
    }
    if (ok && t && win == TRY_TRANSPOSED) { /* the transposed one, in d's place */
        DnnlMm keep = *d;
        *d = *t;
        d->busy = keep.busy;
        d->uncached = keep.uncached;
        d->tried = true;
        *t = keep;
        size_t n = strlen(d->impl);
        util_fmt(d->impl + n, sizeof d->impl - n, ", B transposed");
    }
    mm_free(t);
}

/* ---- the call ---- */

bool ext_matmul_dnnl_takes(const ExtView *av, const ExtView *bv, int64_t M) {
    int r = av->rank;
    int64_t K = av->shape[r - 1];
    /* A's rows dense, or (2-D) A a transpose: its columns dense */
    bool rows = av->stride[r - 1] == 1 && (M == 1 || av->stride[r - 2] >= K);
    bool cols = r == 2 && M > 1 && K > 1 && av->stride[0] == 1 && av->stride[1] >= M;
    return (r == 2 || r == 3) && bv->rank == 2 && (rows || cols) && (r == 2 || av->stride[0] > 0) &&
           bv->stride[0] > 0 && bv->stride[1] > 0 && M > 0 && K > 0 && bv->shape[1] > 0;
}

int ext_matmul_dnnl(const float *a, const ExtView *av, const float *b, const ExtView *bv, float *c,
                    int64_t M, int64_t N, ExtEpilogue epi, void *ctx) {
    if (!ext_matmul_dnnl_takes(av, bv, M)) return 1;
    int r = av->rank;
    int64_t K = av->shape[r - 1], batch = r == 3 ? av->shape[0] : 1;
    ext_dnnl_isa(); /* the ISA cap before the first kernel */
    /* scol: 1 for dense rows, A's column stride for a transpose */
    int64_t srow = M > 1 ? av->stride[r - 2] : K, scol = av->stride[r - 1];
    int64_t key[KEY_LEN] = {M,
                            K,
                            N,
                            srow,
                            scol,
                            bv->stride[0],
                            bv->stride[1],
                            omp_get_max_threads(),
                            batch,
                            batch > 1 ? av->stride[0] : M * srow};
    bool oom;
    DnnlMm *d = mm_take(key, &oom);
    if (d && !d->tried) mm_try(d, a + av->offset, b + bv->offset, c);
    ext_dnnl_impl_note(d ? d->impl : "");
    if (!d) return oom ? -1 : 1;
    void *wb = (void *)(b + bv->offset), *own = NULL;
    dnnl_status_t st = dnnl_success;
    if (d->wei_in) {
        void *kept = kept_b(d, b + bv->offset, &oom);
        if (kept) {
            wb = kept;
        } else if (oom) {
            st = dnnl_out_of_memory;
        } else if ((own = kmalloc(d->wei_bytes + KILN_ALIGN - 1))) {
            wb = util_on_line(own);
            st = reorder_b(d, b + bv->offset, wb);
        } else {
            st = dnnl_out_of_memory;
        }
    }
    if (!st && d->blas)
        mm_blas(d, a + av->offset, wb, c);
    else if (!st)
        st = mm_exec(d, a + av->offset, wb, c);
    kfree(own);
    mm_give(d);
    if (st) return st == dnnl_out_of_memory ? -1 : 1;
    ext_run_epilogue(epi, ctx, c, 0, batch * M * N, N);
    return 0;
}

int ext_matmul_dnnl_count(void) {
    pthread_mutex_lock(&lock);
    int n = 0;
    for (int i = 0; i < CACHE_SIZE; i++) n += cache[i] != NULL;
    pthread_mutex_unlock(&lock);
    return n;
}
