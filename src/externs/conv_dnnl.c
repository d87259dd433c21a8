/*
 * conv_dnnl.c -- conv2d through oneDNN (Debian's libdnnl, the library
 * behind PyTorch's CPU convolutions), kiln's default conv2d backend.
 *
 * Why: its blocked direct convolutions (nChw16c activations, blocked
 * weights) beat im2col + sgemm and the direct depthwise loop even counting
 * the reorders from and to kiln's NCHW (docs/decisions.md: conv2d on
 * oneDNN).
 *
 * How: one primitive per shape computes a few images (as many as keep the
 * output of a call within CALL_BYTES, often one); a call reorders the
 * weights into oneDNN's layout once, then for each few images reorders
 * their input in, convolves (bias included), reorders the output back to
 * NCHW in y and runs the epilogue on it while it is in cache, on each
 * (image, group) slab as the im2col path does. An image whose output is
 * larger than that (the stem: 3.2 MB) goes back in parts of 16 channels,
 * each followed by its epilogue (part_new). Primitives, reorders and memory
 * objects are made on the first call for a shape (and thread count:
 * oneDNN partitions the work when it creates a primitive) and kept in a
 * small cache for the life of the process; the scratch buffers (blocked
 * input, weights and output of one call, oneDNN's scratchpad) are
 * allocated per call with kmalloc.
 *
 * A batch whose calls divide among the threads (ext_conv_dnnl_split:
 * ResNet-18 at batch 8 on 2 threads, every layer but the last) is split
 * among them instead: each thread runs its images' calls on an entry of
 * its own, oneDNN single-threaded inside kiln's parallel region, so no
 * call waits for the other thread and an image's reorders, convolution and
 * epilogue stay in one core's cache (docs/decisions.md: oneDNN: batches
 * split among the threads).
 *
 * One mutex covers the cache and the kept weights, not the execution: a
 * call takes an entry no other call holds (busy), making another for the
 * same shape when every match is busy, so concurrent runs of a program
 * (callers' threads, each with its own OpenMP team) convolve at once, each
 * on memory objects and a stream of its own; the primitives themselves are
 * only read while they run (user-managed scratchpads).
 *
 * Constant weights (ext_conv2d_const_epi: a weight buffer of the program)
 * are reordered once: the blocked copy is kept (Kept, below) under the
 * plain weights' address, shape and the layout the primitive wants, and
 * later calls use it as it is (ResNet-18: 47 MB of reorders per inference
 * saved). The runtime drops a program's copies when it frees the program
 * (ext_kept_forget_all), since the address may next hold other data.
 *
 * A shape oneDNN declines (ext_conv2d_dnnl returns 1) goes to im2col, as
 * does one for which it offers only its reference loops ("ref:any": plain
 * C, slower than im2col + sgemm).
 */
#include "externs/externs.h"
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* What identifies a primitive: xs[1..3], ws[0..3], ys[2..3], attr[0..6],
 * then these: */
enum { K_GROUPS = 15, K_BIAS, K_THREADS, K_IMAGES, K_SLOT, KEY_LEN };
enum { K_WS = 3 }; /* where ws[0..3] start */

/* Memory objects (no buffer of their own; handles set per call); the last
 * two are a block of channels of M_DST and M_DST_PLAIN (see part_new). */
enum { M_SRC_PLAIN, M_SRC, M_WEI_PLAIN, M_WEI, M_BIAS, M_DST, M_DST_PLAIN, M_PAD, M_COUNT };

/* One thread's rows of a part (see part_new): its reorder (shared by the
 * slices with as many rows), memory objects and stream of its own. */
typedef struct {
    int64_t h0, rows;         /* output rows [h0, h0 + rows) */
    dnnl_primitive_t out;     /* not owned: DnnlConv.slice_out */
    dnnl_memory_t blk, plain; /* the rows of a part, blocked and NCHW */
    dnnl_stream_t stream;
} Slice;

/* One shape, ready to run on one image at a time. */
typedef struct {
    int64_t key[KEY_LEN];
    dnnl_primitive_t conv;
    dnnl_primitive_t src_in, wei_in, dst_out; /* reorders; NULL where layouts agree */
    int64_t part, part_stride;     /* channels per part (0: whole images); elements between
                                  * parts in M_DST */
    int64_t row_stride;            /* elements between rows in M_DST */
    dnnl_primitive_t slice_out[2]; /* part rows back to NCHW: H / nslices rows, one more */
    Slice *slices;
    int nslices;
    dnnl_memory_t mem[M_COUNT];
    size_t src_bytes, wei_bytes, dst_bytes, pad_bytes; /* scratch per call */
    dnnl_memory_desc_t wei_md;                         /* the weights' layout for conv */
    dnnl_stream_t stream;
    char impl[32]; /* oneDNN's implementation ("jit:avx2", ...) */
    bool busy;     /* a call holds it: not to be handed out or evicted */
    bool uncached; /* made when every cache slot was busy: freed after its call */
} DnnlConv;

/* Output bytes per call: images are taken together up to this much (the
 * largest divisor of N that fits, at least one image), so small images
 * (ResNet's later layers: 7x7 and 14x14) still give oneDNN enough work per
 * call, while the output of a call stays in the L2 for the epilogue. */
#define CALL_BYTES ((int64_t)1 << 20)

/* The most threads a batch is split among (see the header). */
#define SPLIT_MAX 16

/* The cache: a handful of shapes per network layer type; when full, the
 * oldest entry goes (round robin). */
#define CACHE_SIZE 64
static DnnlConv *cache[CACHE_SIZE];
static int cache_next;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static dnnl_engine_t engine;

/* oneDNN's ISA, capped once per process (oneDNN takes the cap only before
 * it generates its first kernel) to what the target tier of the first
 * program to use it allows (ext_cpu_features on that thread): no AVX-512
 * kernel under v3, SSE4.1 ones under v2. */
static pthread_mutex_t isa_lock = PTHREAD_MUTEX_INITIALIZER;
static bool isa_done;

static void dnnl_isa_init(void) {
    if (__atomic_load_n(&isa_done, __ATOMIC_ACQUIRE)) return;
    pthread_mutex_lock(&isa_lock);
    if (!isa_done) {
        static const dnnl_cpu_isa_t cap[] = {dnnl_cpu_isa_sse41, dnnl_cpu_isa_avx2,
                                             dnnl_cpu_isa_avx512_core};
        dnnl_set_max_cpu_isa(cap[ext_isa_level(ext_cpu_features())]);
        __atomic_store_n(&isa_done, true, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&isa_lock);
}

const char *ext_dnnl_isa(void) {
    dnnl_isa_init();
    switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "its default ISA";
    }
}

static void make_key(int64_t key[KEY_LEN], const int64_t xs[4], const int64_t ws[4],
                     const int64_t ys[4], const int64_t attr[7], bool bias, int64_t nb, int threads,
                     int slot) {
    int64_t k[KEY_LEN] = {xs[1],   xs[2],   xs[3],   ws[0],   ws[1],   ws[2],   ws[3],
                          ys[2],   ys[3],   attr[0], attr[1], attr[2], attr[3], attr[4],
                          attr[5], attr[6], bias,    threads, nb,      slot};
    memcpy(key, k, sizeof k);
}

static void slices_free(DnnlConv *d);

static void conv_free(DnnlConv *d) {
    if (!d) return;
    dnnl_primitive_destroy(d->conv);
    dnnl_primitive_destroy(d->src_in);
    dnnl_primitive_destroy(d->wei_in);
    dnnl_primitive_destroy(d->dst_out);
    slices_free(d);
    for (int i = 0; i < M_COUNT; i++) dnnl_memory_destroy(d->mem[i]);
    dnnl_stream_destroy(d->stream);
    free(d);
}

/* A reorder from -> to, or NULL (and success) when the layouts agree. */
static dnnl_status_t make_reorder(dnnl_primitive_t *r, const dnnl_memory_desc_t *from,
                                  const dnnl_memory_desc_t *to) {
    *r = NULL;
    if (dnnl_memory_desc_equal(from, to)) return dnnl_success;
    dnnl_primitive_desc_t pd;
    dnnl_status_t st = dnnl_reorder_primitive_desc_create(&pd, from, engine, to, engine, NULL);
    if (st != dnnl_success) return st;
    st = dnnl_primitive_create(r, pd);
    dnnl_primitive_desc_destroy(pd);
    return st;
}

/* The convolution's descriptors: kiln's NCHW for one image, the weights as
 * [O, C/g, KH, KW] (groups: [g, O/g, C/g, KH, KW]), and "any" layouts for
 * what oneDNN may choose. */
typedef struct {
    dnnl_memory_desc_t src, wei, bias, dst, src_any, wei_any, dst_any;
    dnnl_memory_desc_t dst_blk[2]; /* nChw16c, nChw8c: see conv_new */
} ConvDescs;

static dnnl_status_t make_descs(ConvDescs *c, const int64_t xs[4], const int64_t ws[4],
                                const int64_t ys[4], int64_t g, int64_t nb) {
    dnnl_dims_t x = {nb, xs[1], xs[2], xs[3]}, y = {nb, ys[1], ys[2], ys[3]}, b = {ws[0]};
    dnnl_dims_t w4 = {ws[0], ws[1], ws[2], ws[3]}, w5 = {g, ws[0] / g, ws[1], ws[2], ws[3]};
    int wn = g > 1 ? 5 : 4;
    const int64_t *w = g > 1 ? w5 : w4;
    dnnl_status_t st = dnnl_memory_desc_init_by_tag(&c->src, 4, x, dnnl_f32, dnnl_nchw);
    if (!st) st = dnnl_memory_desc_init_by_tag(&c->dst, 4, y, dnnl_f32, dnnl_nchw);
    if (!st)
        st = dnnl_memory_desc_init_by_tag(&c->wei, wn, w, dnnl_f32, g > 1 ? dnnl_goihw : dnnl_oihw);
    if (!st) st = dnnl_memory_desc_init_by_tag(&c->bias, 1, b, dnnl_f32, dnnl_x);
    if (!st) st = dnnl_memory_desc_init_by_tag(&c->src_any, 4, x, dnnl_f32, dnnl_format_tag_any);
    if (!st) st = dnnl_memory_desc_init_by_tag(&c->dst_any, 4, y, dnnl_f32, dnnl_format_tag_any);
    if (!st) st = dnnl_memory_desc_init_by_tag(&c->wei_any, wn, w, dnnl_f32, dnnl_format_tag_any);
    if (!st) st = dnnl_memory_desc_init_by_tag(&c->dst_blk[0], 4, y, dnnl_f32, dnnl_nChw16c);
    if (!st) st = dnnl_memory_desc_init_by_tag(&c->dst_blk[1], 4, y, dnnl_f32, dnnl_nChw8c);
    return st;
}

/* The convolution primitive's descriptor, with a user-managed scratchpad
 * (allocated per call, so nothing is shared between calls but the cache). */
static dnnl_status_t make_pd(dnnl_primitive_desc_t *pd, const ConvDescs *c,
                             const dnnl_memory_desc_t *dst, const int64_t attr[7], bool bias) {
    dnnl_dims_t strides = {attr[0], attr[1]}, dil = {attr[4] - 1, attr[5] - 1};
    dnnl_dims_t pad = {attr[2], attr[3]};
    dnnl_convolution_desc_t cd;
    dnnl_status_t st = dnnl_dilated_convolution_forward_desc_init(
        &cd, dnnl_forward_inference, dnnl_convolution_direct, &c->src_any, &c->wei_any,
        bias ? &c->bias : NULL, dst, strides, dil, pad, pad);
    if (st != dnnl_success) return st;
    dnnl_primitive_attr_t pa;
    if ((st = dnnl_primitive_attr_create(&pa)) != dnnl_success) return st;
    st = dnnl_primitive_attr_set_scratchpad_mode(pa, dnnl_scratchpad_mode_user);
    if (!st) st = dnnl_primitive_desc_create(pd, &cd, pa, engine, NULL);
    dnnl_primitive_attr_destroy(pa);
    return st;
}

static dnnl_status_t make_mems(DnnlConv *d, const ConvDescs *c, dnnl_primitive_desc_t pd) {
    const dnnl_memory_desc_t *md[M_COUNT] = {
        &c->src,  dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0),
        &c->wei,  dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0),
        &c->bias, dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0),
        &c->dst,  dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0)};
    dnnl_status_t st = dnnl_success;
    for (int i = 0; i < M_COUNT && !st; i++)
        st = dnnl_memory_create(&d->mem[i], md[i], engine, DNNL_MEMORY_NONE);
    if (st) return st;
    st = make_reorder(&d->src_in, md[M_SRC_PLAIN], md[M_SRC]);
    if (!st) st = make_reorder(&d->wei_in, md[M_WEI_PLAIN], md[M_WEI]);
    if (!st) st = make_reorder(&d->dst_out, md[M_DST], md[M_DST_PLAIN]);
    d->src_bytes = d->src_in ? dnnl_memory_desc_get_size(md[M_SRC]) : 0;
    d->wei_bytes = d->wei_in ? dnnl_memory_desc_get_size(md[M_WEI]) : 0;
    d->wei_md = *md[M_WEI];
    d->dst_bytes = d->dst_out ? dnnl_memory_desc_get_size(md[M_DST]) : 0;
    d->pad_bytes = dnnl_memory_desc_get_size(md[M_PAD]);
    return st;
}

/* A slice's reorder: like make_reorder, but it fails (dnnl_unimplemented)
 * when the reorder needs a scratchpad and is to be shared by threads
 * (shared): then each run would use the same one at once. */
static dnnl_status_t make_slice_reorder(dnnl_primitive_t *r, const dnnl_memory_desc_t *from,
                                        const dnnl_memory_desc_t *to, bool shared) {
    *r = NULL;
    dnnl_primitive_desc_t pd;
    dnnl_status_t st = dnnl_reorder_primitive_desc_create(&pd, from, engine, to, engine, NULL);
    if (st != dnnl_success) return st;
    const dnnl_memory_desc_t *pad = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    if (shared && pad && dnnl_memory_desc_get_size(pad) > 0) st = dnnl_unimplemented;
    if (!st) st = dnnl_primitive_create(r, pd);
    dnnl_primitive_desc_destroy(pd);
    return st;
}

static void slices_free(DnnlConv *d) {
    for (int i = 0; i < 2; i++) {
        dnnl_primitive_destroy(d->slice_out[i]);
        d->slice_out[i] = NULL;
    }
    for (int i = 0; d->slices && i < d->nslices; i++) {
        dnnl_memory_destroy(d->slices[i].blk);
        dnnl_memory_destroy(d->slices[i].plain);
        dnnl_stream_destroy(d->slices[i].stream);
    }
    free(d->slices);
    d->slices = NULL;
    d->nslices = 0;
}

/* n slices of rows of `part` channels of dst (blocked) and plain (NCHW). */
static dnnl_status_t slices_new(DnnlConv *d, const dnnl_memory_desc_t *dst,
                                const dnnl_memory_desc_t *plain, int64_t part, int n) {
    int64_t h = dst->dims[2];
    if (!(d->slices = calloc((size_t)n, sizeof *d->slices))) return dnnl_out_of_memory;
    d->nslices = n;
    dnnl_status_t st = dnnl_success;
    for (int i = 0; i < n && !st; i++) {
        Slice *sl = &d->slices[i];
        sl->h0 = h * i / n;
        sl->rows = h * (i + 1) / n - sl->h0;
        int k = sl->rows != h / n; /* h / n rows, or one more */
        dnnl_dims_t dims = {dst->dims[0], part, sl->rows, dst->dims[3]}, zero = {0, 0, 0, 0};
        dnnl_memory_desc_t sub, sub_plain;
        st = dnnl_memory_desc_init_submemory(&sub, dst, dims, zero);
        if (!st) st = dnnl_memory_desc_init_submemory(&sub_plain, plain, dims, zero);
        if (!st) st = dnnl_memory_create(&sl->blk, &sub, engine, DNNL_MEMORY_NONE);
        if (!st) st = dnnl_memory_create(&sl->plain, &sub_plain, engine, DNNL_MEMORY_NONE);
        if (!st) st = dnnl_stream_create(&sl->stream, engine, dnnl_stream_default_flags);
        if (!st && !d->slice_out[k])
            st = make_slice_reorder(&d->slice_out[k], &sub, &sub_plain, n > 1);
        sl->out = d->slice_out[k];
    }
    if (st) slices_free(d);
    return st;
}

/* When one call's output is larger than CALL_BYTES (one big image: the
 * stem of a ResNet), the reorder back to NCHW and the epilogue go in parts
 * of `part` channels, and each part in slices of output rows, one per
 * thread: a thread reorders its rows of a part and at once runs their
 * epilogue, so the epilogue finds them in its own core's cache, and goes on
 * to its rows of the next part with no barrier in between: one parallel
 * region. (A reorder region and an epilogue region per part, each splitting
 * the part its own way, would leave the epilogue reading half the rows from
 * the other core's cache: docs/decisions.md: oneDNN: a large output in
 * parts, one parallel region.)
 * That needs oneDNN's output blocked by channels only (nChw16c, nChw8c)
 * and one group: a part's rows are then a strided piece of both layouts,
 * and a reorder between sub-memories serves every part with moved handles.
 * A reorder that wants a scratchpad cannot be shared by threads: then one
 * slice. Otherwise (or when oneDNN declines) part stays 0. */
static void part_new(DnnlConv *d, const dnnl_memory_desc_t *dst, const dnnl_memory_desc_t *plain,
                     int64_t groups) {
    const dnnl_blocking_desc_t *b = &dst->format_desc.blocking;
    int64_t c = dst->dims[1], h = dst->dims[2], plane = dst->dims[2] * dst->dims[3], blk;
    if (!d->dst_out || groups != 1 || dst->format_kind != dnnl_blocked || b->inner_nblks != 1 ||
        b->inner_idxs[0] != 1 || dnnl_memory_desc_get_size(dst) <= (size_t)CALL_BYTES)
        return;
    blk = b->inner_blks[0];
    int64_t part = CALL_BYTES / (plane * (int64_t)sizeof(float)) / blk * blk;
    while (part > 0 && c % part) part -= blk;
    if (part <= 0 || part >= c) return;
    int n = (int)(d->key[K_THREADS] < h ? d->key[K_THREADS] : h);
    if (n > 1 && slices_new(d, dst, plain, part, n) != dnnl_success) n = 1;
    if (n <= 1 && slices_new(d, dst, plain, part, 1) != dnnl_success) return;
    d->part = part;
    d->part_stride = part / blk * b->strides[1];
    d->row_stride = b->strides[2];
}

/* Did oneDNN answer with one of its reference implementations ("ref:any"),
 * plain C loops it keeps for layouts its kernels do not take? */
static bool is_ref(dnnl_primitive_desc_t pd) {
    char impl[32];
    ext_dnnl_impl_of(pd, impl);
    return !strncmp(impl, "ref", 3);
}

/* A new entry for this shape, or NULL when oneDNN declines it. */
static DnnlConv *conv_new(const int64_t key[KEY_LEN], const int64_t xs[4], const int64_t ws[4],
                          const int64_t ys[4], const int64_t attr[7], bool bias) {
    DnnlConv *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    memcpy(d->key, key, sizeof d->key);
    ConvDescs c;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t st = make_descs(&c, xs, ws, ys, attr[6], key[K_IMAGES]);
    /* An output larger than CALL_BYTES goes back to NCHW in parts of
     * channels (part_new), which needs it blocked by channels: oneDNN's own
     * choice can be NHWC (the stem: 3 input channels). Blocks of 16 where
     * its kernels take them (AVX-512), the last one padded when the
     * channels are not a multiple of 16 (24: nChw8c ran the AVX2 kernel
     * there), else of 8 (AVX2, SSE4.1); a layout only a reference
     * implementation takes is not one: the stem with nChw16c output on
     * AVX2 ran oneDNN's ref:any loops, 1.05 s instead of 4 ms
     * (docs/decisions.md: oneDNN: never its reference loops). A padded
     * layout has no parts (part_new: they must divide the channels). */
    int64_t bytes = key[K_IMAGES] * ys[1] * ys[2] * ys[3] * (int64_t)sizeof(float);
    for (int b = 0; b < 2 && !st && !pd && attr[6] == 1 && bytes > CALL_BYTES; b++) {
        if (b && ys[1] % 8) continue;
        if (make_pd(&pd, &c, &c.dst_blk[b], attr, bias) != dnnl_success) pd = NULL;
        if (pd && is_ref(pd)) dnnl_primitive_desc_destroy(pd), pd = NULL;
    }
    if (!st && !pd) st = make_pd(&pd, &c, &c.dst_any, attr, bias);
    /* reference loops only: declined, im2col + sgemm is faster */
    if (!st && is_ref(pd)) st = dnnl_unimplemented;
    if (!st) ext_dnnl_impl_of(pd, d->impl);
    if (!st) st = dnnl_primitive_create(&d->conv, pd);
    if (!st) st = make_mems(d, &c, pd);
    if (!st) st = dnnl_stream_create(&d->stream, engine, dnnl_stream_default_flags);
    if (!st) part_new(d, dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0), &c.dst, attr[6]);
    dnnl_primitive_desc_destroy(pd);
    if (st == dnnl_success) return d;
    conv_free(d);
    return NULL;
}

/* An entry for a shape that no call holds, marked busy (made on a miss, or
 * when every match is busy); NULL: oneDNN declines it. Called with the lock
 * held; the caller hands it back with release. */
static DnnlConv *lookup(const int64_t xs[4], const int64_t ws[4], const int64_t ys[4],
                        const int64_t attr[7], bool bias, int64_t nb, int threads, int slot) {
    int64_t key[KEY_LEN];
    make_key(key, xs, ws, ys, attr, bias, nb, threads, slot);
    for (int i = 0; i < CACHE_SIZE; i++)
        if (cache[i] && !cache[i]->busy && !memcmp(cache[i]->key, key, sizeof key)) {
            cache[i]->busy = true;
            return cache[i];
        }
    if (!engine) dnnl_isa_init();
    if (!engine && dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success) return NULL;
    DnnlConv *d = conv_new(key, xs, ws, ys, attr, bias);
    if (!d) return NULL;
    d->busy = true;
    /* the oldest entry goes, but not one a call holds; when all are held
     * (as many calls at once as slots), d lives for its call only */
    int tries = 0;
    while (cache[cache_next] && cache[cache_next]->busy && tries++ < CACHE_SIZE)
        cache_next = (cache_next + 1) % CACHE_SIZE;
    if (cache[cache_next] && cache[cache_next]->busy) {
        d->uncached = true;
        return d;
    }
    conv_free(cache[cache_next]);
    cache[cache_next] = d;
    cache_next = (cache_next + 1) % CACHE_SIZE;
    return d;
}

/* Hand an entry from lookup back; the lock held. */
static void release(DnnlConv *d) {
    if (!d) return;
    d->busy = false;
    if (d->uncached) conv_free(d);
}

static dnnl_status_t exec(DnnlConv *d, dnnl_primitive_t p, int n, const dnnl_exec_arg_t *args) {
    return dnnl_primitive_execute(p, d->stream, n, args);
}

static dnnl_status_t reorder(DnnlConv *d, dnnl_primitive_t r, int from, int to) {
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, d->mem[from]}, {DNNL_ARG_TO, d->mem[to]}};
    return exec(d, r, 2, args);
}

/* ---- constant weights, reordered once ---- */

/* One constant weight in a primitive's layout. Two primitives (thread
 * counts, image counts) may want one weight in different layouts, hence md
 * in the key. */
typedef struct {
    ExtKept base; /* w, raw (kmalloc'd), bytes, next */
    int64_t ws[4], groups;
    dnnl_memory_desc_t md; /* the layout of data */
    void *data;            /* raw, 64-byte aligned */
} Kept;

/* All kept copies together stay under this; a weight beyond it is
 * reordered per call as a runtime one (models far larger than ResNet-50's
 * 100 MB of weights, many programs alive at once). */
#define KEPT_MAX ((size_t)1 << 30)
static ExtKeptList dnnl_kept = {.lock = &lock}; /* of Kept entries */

static Kept *kept_find(const DnnlConv *d, const float *w) {
    for (ExtKept *e = dnnl_kept.head; e; e = e->next) {
        Kept *k = (Kept *)e;
        if (e->w == w && !memcmp(k->ws, d->key + K_WS, sizeof k->ws) &&
            k->groups == d->key[K_GROUPS] && dnnl_memory_desc_equal(&k->md, &d->wei_md))
            return k;
    }
    return NULL;
}

/* w into to, in d's layout. */
static dnnl_status_t reorder_weights(DnnlConv *d, const float *w, void *to) {
    dnnl_status_t st = dnnl_memory_set_data_handle(d->mem[M_WEI_PLAIN], (void *)w);
    if (!st) st = dnnl_memory_set_data_handle(d->mem[M_WEI], to);
    if (!st) st = reorder(d, d->wei_in, M_WEI_PLAIN, M_WEI);
    if (!st) st = dnnl_stream_wait(d->stream);
    return st;
}

/* w in d's layout, kept for later calls (made now on a miss); NULL when it
 * cannot be kept (over KEPT_MAX, out of memory): the caller reorders it. */
static void *kept_weights(DnnlConv *d, const float *w) {
    Kept *k = kept_find(d, w);
    if (k) return k->data;
    if (dnnl_kept.bytes + d->wei_bytes > KEPT_MAX || !(k = kmalloc(sizeof *k))) return NULL;
    *k = (Kept){
        .base = {.w = w, .bytes = d->wei_bytes}, .groups = d->key[K_GROUPS], .md = d->wei_md};
    memcpy(k->ws, d->key + K_WS, sizeof k->ws);
    if (!(k->base.raw = kmalloc(k->base.bytes + KILN_ALIGN - 1))) {
        ext_kept_free(&k->base);
        return NULL;
    }
    k->data = util_on_line(k->base.raw);
    if (reorder_weights(d, w, k->data) != dnnl_success) {
        ext_kept_free(&k->base);
        return NULL;
    }
    ext_kept_add(&dnnl_kept, &k->base);
    return k->data;
}

/* ---- running ---- */

/* The output of one call back to NCHW in y (images from n), in parts of
 * d->part channels, each slice of rows followed by its epilogue on the
 * thread that moved it (see part_new). */
static dnnl_status_t out_parts(DnnlConv *d, float *y, int64_t n, const int64_t ys[4],
                               ExtEpilogue epi, void *ctx) {
    int64_t w = ys[3], plane = ys[2] * w, yn = ys[1] * plane;
    void *dst = NULL;
    if (dnnl_memory_get_data_handle(d->mem[M_DST], &dst) != dnnl_success) return dnnl_runtime_error;
    int bad = 0;
#pragma omp parallel for schedule(static) num_threads(d->nslices) if (d->nslices > 1) \
    reduction(|                                                                       \
              : bad)
    for (int i = 0; i < d->nslices; i++) {
        const Slice *sl = &d->slices[i];
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, sl->blk}, {DNNL_ARG_TO, sl->plain}};
        for (int64_t c = 0; c < ys[1] && !bad; c += d->part) {
            float *from = (float *)dst + c / d->part * d->part_stride + sl->h0 * d->row_stride;
            float *to = y + n * yn + c * plane + sl->h0 * w;
            bad |= dnnl_memory_set_data_handle(sl->blk, from) != dnnl_success ||
                   dnnl_memory_set_data_handle(sl->plain, to) != dnnl_success ||
                   dnnl_primitive_execute(sl->out, sl->stream, 2, args) != dnnl_success ||
                   dnnl_stream_wait(sl->stream) != dnnl_success;
            for (int64_t m = 0; m < d->key[K_IMAGES] && !bad && epi; m++)
                for (int64_t k = 0; k < d->part; k++)
                    epi(ctx, y, (n + m) * yn + (c + k) * plane + sl->h0 * w, sl->rows * w);
        }
    }
    return bad ? dnnl_runtime_error : dnnl_success;
}

/* Images [n, n + nb): input in, convolution, output back to y, epilogue. */
static dnnl_status_t conv_images(DnnlConv *d, const float *x, float *y, int64_t n,
                                 const int64_t xs[4], const int64_t ys[4], ExtEpilogue epi,
                                 void *ctx) {
    int64_t xn = xs[1] * xs[2] * xs[3], yn = ys[1] * ys[2] * ys[3], nb = d->key[K_IMAGES];
    dnnl_status_t st = dnnl_memory_set_data_handle(d->mem[M_SRC_PLAIN], (void *)(x + n * xn));
    if (!st) st = dnnl_memory_set_data_handle(d->mem[M_DST_PLAIN], y + n * yn);
    if (!d->src_in && !st) st = dnnl_memory_set_data_handle(d->mem[M_SRC], (void *)(x + n * xn));
    if (!d->dst_out && !st) st = dnnl_memory_set_data_handle(d->mem[M_DST], y + n * yn);
    if (d->src_in && !st) st = reorder(d, d->src_in, M_SRC_PLAIN, M_SRC);
    dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, d->mem[M_SRC]},
                               {DNNL_ARG_WEIGHTS, d->mem[M_WEI]},
                               {DNNL_ARG_DST, d->mem[M_DST]},
                               {DNNL_ARG_SCRATCHPAD, d->mem[M_PAD]},
                               {DNNL_ARG_BIAS, d->mem[M_BIAS]}};
    if (!st) st = exec(d, d->conv, d->key[K_BIAS] ? 5 : 4, args);
    if (d->part && !st) return out_parts(d, y, n, ys, epi, ctx);
    if (d->dst_out && !st) st = reorder(d, d->dst_out, M_DST, M_DST_PLAIN);
    if (!st) st = dnnl_stream_wait(d->stream);
    int64_t groups = d->key[K_GROUPS];
    if (!st) ext_run_epilogue_slabs(epi, ctx, y, n * yn, nb * groups, yn / groups, ys[2] * ys[3]);
    return st;
}

/* 64-byte aligned pieces of one scratch block. */
static void *carve(char **p, size_t bytes) {
    char *r = *p;
    *p += (bytes + 63) / 64 * 64;
    return bytes ? r : NULL;
}

/* kw: the weights already in d's layout (kept), or NULL. */
static int run(DnnlConv *d, const float *x, const int64_t xs[4], const float *w, void *kw,
               const float *bias, float *y, const int64_t ys[4], int64_t n0, int64_t n1,
               ExtEpilogue epi, void *ctx) {
    size_t wei_bytes = kw ? 0 : d->wei_bytes;
    size_t total = 64 * 5 + d->src_bytes + wei_bytes + d->dst_bytes + d->pad_bytes;
    char *block = kmalloc(total), *p = block;
    if (!block) return -1;
    p = util_on_line(p);
    void *src = carve(&p, d->src_bytes), *wei = carve(&p, wei_bytes);
    void *dst = carve(&p, d->dst_bytes), *pad = carve(&p, d->pad_bytes);
    void *blocked = kw ? kw : d->wei_in ? wei : (void *)w;
    dnnl_status_t st = dnnl_memory_set_data_handle(d->mem[M_WEI_PLAIN], (void *)w);
    if (!st) st = dnnl_memory_set_data_handle(d->mem[M_WEI], blocked);
    if (!st && src) st = dnnl_memory_set_data_handle(d->mem[M_SRC], src);
    if (!st && dst) st = dnnl_memory_set_data_handle(d->mem[M_DST], dst);
    if (!st) st = dnnl_memory_set_data_handle(d->mem[M_PAD], pad);
    if (!st && bias) st = dnnl_memory_set_data_handle(d->mem[M_BIAS], (void *)bias);
    if (!st && d->wei_in && !kw) st = reorder(d, d->wei_in, M_WEI_PLAIN, M_WEI);
    for (int64_t n = n0; n < n1 && !st; n += d->key[K_IMAGES])
        st = conv_images(d, x, y, n, xs, ys, epi, ctx);
    kfree(block);
    return st == dnnl_success ? 0 : -1;
}

static int64_t images_per_call(const int64_t ys[4]) {
    int64_t image = ys[1] * ys[2] * ys[3] * (int64_t)sizeof(float), nb = ys[0];
    while (nb > 1 && (nb * image > CALL_BYTES || ys[0] % nb)) nb--;
    return nb;
}

int ext_conv_dnnl_split(const int64_t ys[4], int threads) {
    int64_t calls = ys[0] / images_per_call(ys);
    return threads > 1 && threads <= SPLIT_MAX && calls % threads == 0 ? threads : 0;
}

/* The implementation of the primitive this thread's last conv2d or
 * matmul call on oneDNN ran (ext_dnnl_last_impl); none after a reset. */
static _Thread_local char last_impl[32];
static _Thread_local bool last_set;

const char *ext_dnnl_last_impl(void) { return last_set ? last_impl : NULL; }

void ext_dnnl_impl_reset(void) { last_set = false; }

void ext_dnnl_impl_note(const char *impl) {
    util_fmt(last_impl, sizeof last_impl, "%s", impl ? impl : "");
    last_set = true;
}

/* A primitive descriptor's implementation, into impl[32]. */
void ext_dnnl_impl_of(const void *pd, char impl[32]) {
    const char *s = NULL;
    if (dnnl_primitive_desc_query((const_dnnl_primitive_desc_t)pd, dnnl_query_impl_info_str, 0,
                                  &s) != dnnl_success)
        s = NULL;
    util_fmt(impl, 32, "%s", s ? s : "?");
}

/* The batch split among `split` threads (see the header): thread t runs
 * its share of the calls, consecutive images, on an entry of its own (slot
 * t + 1: memory objects, stream and scratch of its own; oneDNN called
 * inside a parallel region runs on the calling thread alone). Weights that
 * need a reorder are reordered once, before, and shared. */
static int run_split(int split, int64_t nb, const float *x, const int64_t xs[4], const float *w,
                     const int64_t ws[4], const float *bias, float *y, const int64_t ys[4],
                     const int64_t attr[7], bool wconst, ExtEpilogue epi, void *ctx) {
    DnnlConv *ds[SPLIT_MAX];
    int got = 0, r = 0;
    /* each entry busy as it is found, so that making the next does not
     * evict it */
    pthread_mutex_lock(&lock);
    for (; got < split && r == 0; got++)
        if (!(ds[got] = lookup(xs, ws, ys, attr, bias != NULL, nb, 1, got + 1))) r = 1;
    void *kw = NULL, *raw = NULL;
    if (r == 0 && ds[0]->wei_in && wconst) kw = kept_weights(ds[0], w);
    ext_dnnl_impl_note(r == 0 ? ds[0]->impl : "");
    pthread_mutex_unlock(&lock);
    if (r == 0 && ds[0]->wei_in && !kw) {
        raw = kmalloc(ds[0]->wei_bytes + KILN_ALIGN - 1);
        kw = raw ? util_on_line(raw) : NULL;
        if (!raw || reorder_weights(ds[0], w, kw) != dnnl_success) r = -1;
    }
    if (r == 0) {
        int64_t per = ys[0] / split;
        int bad = 0;
#pragma omp parallel for num_threads(split) schedule(static) reduction(| : bad)
        for (int t = 0; t < split; t++)
            bad |= run(ds[t], x, xs, w, kw, bias, y, ys, t * per, (t + 1) * per, epi, ctx) != 0;
        r = bad ? -1 : 0;
    }
    pthread_mutex_lock(&lock);
    for (int t = 0; t < got; t++) release(ds[t]);
    pthread_mutex_unlock(&lock);
    kfree(raw);
    return r;
}

int ext_conv2d_dnnl(const float *x, const int64_t xs[4], const float *w, const int64_t ws[4],
                    const float *bias, float *y, const int64_t ys[4], const int64_t attr[7],
                    bool wconst, ExtEpilogue epi, void *ctx) {
    int64_t nb = images_per_call(ys);
    int split = omp_in_parallel() ? 0 : ext_conv_dnnl_split(ys, omp_get_max_threads());
    if (split) return run_split(split, nb, x, xs, w, ws, bias, y, ys, attr, wconst, epi, ctx);
    pthread_mutex_lock(&lock);
    DnnlConv *d = lookup(xs, ws, ys, attr, bias != NULL, nb, omp_get_max_threads(), 0);
    void *kw = d && wconst && d->wei_in ? kept_weights(d, w) : NULL;
    ext_dnnl_impl_note(d ? d->impl : "");
    pthread_mutex_unlock(&lock);
    int r = d ? run(d, x, xs, w, kw, bias, y, ys, 0, ys[0], epi, ctx) : 1;
    pthread_mutex_lock(&lock);
    release(d);
    pthread_mutex_unlock(&lock);
    return r;
}
