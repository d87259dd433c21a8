/*
 * onnx.c -- ONNX models (.onnx) and tensors (.pb) into kiln.
 *
 * The files are protobuf messages; their reader is C that protoc-c
 * generates at build time from the onnx.proto Debian's libonnx-dev ships
 * (build/gen/onnx.pb-c.[ch]), so no decoder is written by hand here, and a
 * malformed or truncated file is protobuf-c returning NULL: an error
 * naming the file. Every allocation protobuf-c makes goes through kiln's
 * hook (kmalloc).
 *
 * kiln_onnx_import walks the model once: initializers become constants,
 * graph inputs kiln inputs (shapes from the model or the caller), then each
 * node in file order is converted by onnx_ops.c, and the graph outputs are
 * marked. A failure names the file and the node (index, name, op).
 *
 * Tensors are read as little-endian raw bytes or from the typed repeated
 * fields, as ONNX allows both; kiln targets little-endian machines only.
 */
#include "front/front.h"
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- protobuf-c through kiln's allocator ---------------------------------- */

/* protobuf-c returns NULL both for a malformed message and when an
 * allocation fails; ud (a bool) tells the two apart. */
static void *pb_alloc(void *ud, size_t n) {
    void *p = kmalloc(n ? n : 1);
    if (!p) *(bool *)ud = true;
    return p;
}
static void pb_free(void *ud, void *p) {
    (void)ud;
    kfree(p);
}

/* A whole file into a kmalloc'd buffer; false with err set. sb (may be
 * NULL) receives the open file's status (fstat), all zero when unknown. */
static bool read_file(const char *path, unsigned char **data, size_t *len, char *err, size_t errlen,
                      kiln_status *st, struct stat *sb) {
    FILE *f = fopen(path, "rb");
    *st = KILN_ERR_INPUT;
    if (!f) {
        util_fmt(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return false;
    }
    /* a regular file's size first (one read, no doubling); then grow if it
     * grew */
    struct stat own, *fs = sb ? sb : &own;
    if (fstat(fileno(f), fs) != 0) memset(fs, 0, sizeof *fs);
    size_t cap =
               S_ISREG(fs->st_mode) && fs->st_size > 0 ? (size_t)fs->st_size + 1 : (size_t)1 << 16,
           n = 0;
    unsigned char *buf = kmalloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        unsigned char *nb = cap > SIZE_MAX / 2 ? NULL : krealloc(buf, cap * 2);
        if (!nb) {
            kfree(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    bool bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        kfree(buf);
        *st = buf ? KILN_ERR_ENV : KILN_ERR_NOMEM;
        util_fmt(err, errlen, "%s: %s", path, bad ? "read error" : "out of memory");
        return false;
    }
    *data = buf;
    *len = n;
    return true;
}

/* ---- element types -------------------------------------------------------- */

const char *ox_type_name(int type) {
    static const char *names[] = {"undefined",  "float",   "uint8",  "int8",   "uint16",
                                  "int16",      "int32",   "int64",  "string", "bool",
                                  "float16",    "double",  "uint32", "uint64", "complex64",
                                  "complex128", "bfloat16"};
    return type >= 0 && type < (int)(sizeof names / sizeof names[0]) ? names[type] : "unknown";
}

static int type_size(int type) {
    switch (type) {
    case OT_FLOAT:
    case OT_INT32:
    case OT_UINT32: return 4;
    case OT_INT64:
    case OT_UINT64:
    case OT_DOUBLE: return 8;
    case OT_UINT8:
    case OT_INT8:
    case OT_BOOL: return 1;
    case OT_UINT16:
    case OT_INT16:
    case OT_FLOAT16:
    case OT_BFLOAT16: return 2;
    }
    return 0;
}

/* The kiln dtype of an ONNX type at the boundary; -1 when none. */
static int kiln_type(int type) {
    switch (type) {
    case OT_FLOAT: return KILN_F32;
    case OT_DOUBLE: return KILN_F64;
    case OT_INT32: return KILN_I32;
    case OT_INT64: return KILN_I64;
    case OT_BOOL: return KILN_BOOL;
    case OT_INT8: return KILN_I8;
    case OT_UINT8: return KILN_U8;
    case OT_INT16: return KILN_I16;
    case OT_UINT16: return KILN_U16;
    case OT_UINT32: return KILN_U32;
    case OT_UINT64: return KILN_U64;
    case OT_FLOAT16: return KILN_F16;
    case OT_BFLOAT16: return KILN_BF16;
    }
    return -1;
}

static double raw_elem(int type, const uint8_t *p) {
    switch (type) {
    case OT_FLOAT: {
        float v;
        memcpy(&v, p, 4);
        return v;
    }
    case OT_DOUBLE: {
        double v;
        memcpy(&v, p, 8);
        return v;
    }
    case OT_INT32: {
        int32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    case OT_UINT32: {
        uint32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    case OT_INT64: {
        int64_t v;
        memcpy(&v, p, 8);
        return (double)v;
    }
    case OT_UINT64: {
        uint64_t v;
        memcpy(&v, p, 8);
        return (double)v;
    }
    case OT_INT16: {
        int16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    case OT_UINT16: {
        uint16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    case OT_FLOAT16:
    case OT_BFLOAT16: {
        uint16_t v;
        memcpy(&v, p, 2);
        return type == OT_FLOAT16 ? util_f16_to_f32(v) : util_bf16_to_f32(v);
    }
    case OT_INT8: return (int8_t)*p;
    default: return *p; /* uint8, bool */
    }
}

/* Element k of t set to v (an integer type's value in range). */
static void set_elem(kiln_tensor *t, int64_t k, double v) {
    switch (t->dtype) {
    case KILN_F32: ((float *)t->data)[k] = (float)v; break;
    case KILN_F64: ((double *)t->data)[k] = v; break;
    case KILN_I32: ((int32_t *)t->data)[k] = (int32_t)v; break;
    case KILN_I64: ((int64_t *)t->data)[k] = (int64_t)v; break;
    case KILN_BOOL: ((uint8_t *)t->data)[k] = v != 0; break;
    case KILN_I8: ((int8_t *)t->data)[k] = (int8_t)v; break;
    case KILN_U8: ((uint8_t *)t->data)[k] = (uint8_t)v; break;
    case KILN_I16: ((int16_t *)t->data)[k] = (int16_t)v; break;
    case KILN_U16: ((uint16_t *)t->data)[k] = (uint16_t)v; break;
    case KILN_U32: ((uint32_t *)t->data)[k] = (uint32_t)v; break;
    case KILN_U64: ((uint64_t *)t->data)[k] = (uint64_t)v; break;
    case KILN_F16: ((uint16_t *)t->data)[k] = util_f32_to_f16((float)v); break;
    case KILN_BF16: ((uint16_t *)t->data)[k] = util_f32_to_bf16((float)v); break;
    }
}

/* Whether location names a file inside dir: relative, no ".." component,
 * and its real path (links resolved) under dir's. Sets full. */
static const char *inside(const char *dir, const char *location, char *full, size_t len) {
    if (!location[0]) return "an empty location";
    if (location[0] == '/') return "an absolute location (a model's data must be in its folder)";
    for (const char *p = location; *p;) {
        const char *e = strchr(p, '/');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == 2 && p[0] == '.' && p[1] == '.')
            return "a location with '..' (outside the model's folder)";
        p += l + (e ? 1 : 0);
    }
    char rdir[PATH_MAX], rfile[PATH_MAX];
    util_fmt(full, len, "%s/%s", dir, location);
    if (!realpath(dir, rdir) || !realpath(full, rfile)) return NULL; /* open() says why */
    size_t k = strlen(rdir);
    if (strncmp(rfile, rdir, k) || (rfile[k] != '/' && strcmp(rdir, "/")))
        return "a location that leads out of the model's folder (through a link)";
    return NULL;
}

/* The n values of an external tensor (data_location EXTERNAL): the
 * entries location, offset and length; the file is memory-mapped and
 * read in place. base is the model's path (its folder holds the data);
 * NULL for a lone .pb file, which cannot have any. */
static const char *external_values(const char *base, const Onnx__TensorProto *t, int64_t n, int es,
                                   double *out) {
    static _Thread_local char why[700];
    const char *loc = NULL;
    int64_t off = 0, len = -1;
    for (size_t i = 0; i < t->n_external_data; i++) {
        const char *k = t->external_data[i]->key ? t->external_data[i]->key : "";
        const char *v = t->external_data[i]->value ? t->external_data[i]->value : "";
        char *end = NULL;
        if (!strcmp(k, "location")) {
            loc = v;
        } else if (!strcmp(k, "offset") || !strcmp(k, "length")) {
            errno = 0;
            long long x = strtoll(v, &end, 10);
            if (!*v || *end || errno || x < 0)
                return util_fmt(why, sizeof why, "external data %s '%.100s' is not a byte count", k,
                                v),
                       why;
            *(k[0] == 'o' ? &off : &len) = x;
        }
    }
    if (!base) return "external data in a tensor file (only a model's tensors can have it)";
    if (!loc) return "external data without a location";
    char dir[PATH_MAX], full[PATH_MAX + 512];
    util_fmt(dir, sizeof dir, "%s", base);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        util_fmt(dir, sizeof dir, ".");
    if (slash == dir) util_fmt(dir, sizeof dir, "/");
    const char *bad = inside(dir, loc, full, sizeof full);
    if (bad) return util_fmt(why, sizeof why, "external data '%.200s': %s", loc, bad), why;
    int fd = open(full, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int e = fd < 0 ? errno : EINVAL;
        if (fd >= 0) close(fd);
        return util_fmt(why, sizeof why, "external data '%.200s': cannot open: %s", loc,
                        e == EINVAL ? "not a regular file" : strerror(e)),
               why;
    }
    int64_t need = n * es, size = (int64_t)st.st_size;
    if (len < 0) len = need;
    if (len != need || off > size || len > size - off) {
        close(fd);
        return util_fmt(why, sizeof why,
                        "external data '%.200s': %lld bytes at offset %lld, but the tensor needs "
                        "%lld and the file has %lld",
                        loc, (long long)len, (long long)off, (long long)need, (long long)size),
               why;
    }
    if (!need) return close(fd), NULL;
    void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return util_fmt(why, sizeof why, "external data '%.200s': cannot map: %s", loc,
                        strerror(errno)),
               why;
    const uint8_t *p = (const uint8_t *)m + off;
    for (int64_t k = 0; k < n; k++) out[k] = raw_elem(t->data_type, p + k * es);
    munmap(m, (size_t)size);
    return NULL;
}

/* The n values of t as doubles; NULL (message in err) when t cannot be read.
 * base: the model's path, for external data (NULL for a .pb file). */
static const char *tensor_values(const char *base, const Onnx__TensorProto *t, int64_t n,
                                 double *out) {
    int type = t->data_type, es = type_size(type);
    if (!es) return "unsupported element type";
    if (t->has_data_location && t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL)
        return external_values(base, t, n, es, out);
    if (t->has_raw_data && t->raw_data.len) {
        if (t->raw_data.len != (size_t)n * (size_t)es)
            return "raw data size does not match the dims";
        for (int64_t k = 0; k < n; k++) out[k] = raw_elem(type, t->raw_data.data + k * es);
        return NULL;
    }
    size_t have = type == OT_FLOAT                         ? t->n_float_data
                  : type == OT_DOUBLE                      ? t->n_double_data
                  : type == OT_INT64                       ? t->n_int64_data
                  : type == OT_UINT32 || type == OT_UINT64 ? t->n_uint64_data
                                                           : t->n_int32_data;
    if (have != (size_t)n) return "the number of values does not match the dims";
    for (int64_t k = 0; k < n; k++)
        out[k] = type == OT_FLOAT                         ? t->float_data[k]
                 : type == OT_DOUBLE                      ? t->double_data[k]
                 : type == OT_INT64                       ? (double)t->int64_data[k]
                 : type == OT_UINT32 || type == OT_UINT64 ? (double)t->uint64_data[k]
                 : type == OT_FLOAT16  ? util_f16_to_f32((uint16_t)t->int32_data[k])
                 : type == OT_BFLOAT16 ? util_bf16_to_f32((uint16_t)t->int32_data[k])
                                       : t->int32_data[k];
    return NULL;
}

/* Dims of t into rank/shape (zero-sized dims allowed for constants). */
static const char *tensor_dims(const Onnx__TensorProto *t, int *rank, int64_t *shape,
                               int64_t *numel) {
    if (t->n_dims > KILN_MAX_RANK) return "unsupported: rank above 8";
    *rank = (int)t->n_dims;
    *numel = 1;
    for (size_t i = 0; i < t->n_dims; i++) {
        if (t->dims[i] < 0 || t->dims[i] > ((int64_t)1 << 40)) return "bad dims";
        shape[i] = t->dims[i];
        if (t->dims[i] && *numel > ((int64_t)1 << 40) / t->dims[i]) return "too many elements";
        *numel *= t->dims[i];
    }
    return NULL;
}

bool ox_tensor_const(OxImp *im, const Onnx__TensorProto *t, OxVal *out) {
    int64_t n;
    const char *why = tensor_dims(t, &out->rank, out->shape, &n);
    out->type = t->has_data_type ? t->data_type : 0;
    out->c = why ? NULL : arena_alloc(&im->arena, sizeof(double) * (size_t)(n ? n : 1));
    if (!why && !out->c) return graph_fail(im->g, KILN_ERR_NOMEM, "out of memory"), false;
    if (!why) why = tensor_values(im->path, t, n, out->c);
    if (why)
        graph_fail(im->g, KILN_ERR_INPUT, "tensor '%s' (%s): %s", t->name ? t->name : "",
                   ox_type_name(out->type), why);
    return !why;
}

/* ---- importing ---------------------------------------------------------- */

static bool fail(OxImp *im, const char *fmt, const char *a, const char *b) {
    char msg[900];
    util_fmt(msg, sizeof msg, fmt, a, b);
    graph_fail(im->g, KILN_ERR_INPUT, "%s: %s", im->path, msg);
    return false;
}

/* The graph's error, prefixed with the file and what (e.g. "input 'x'"),
 * keeping its status (out of memory stays out of memory). */
static bool rewrap(OxImp *im, const char *what, const char *name) {
    char msg[1024], w[300];
    kiln_status st = im->g->status;
    util_fmt(msg, sizeof msg, "%s", kiln_error(im->g));
    util_fmt(w, sizeof w, what, name);
    graph_clear_error(im->g);
    graph_fail(im->g, st, "%s: %s: %s", im->path, w, msg);
    return false;
}

static int find_opset(OxImp *im, const Onnx__ModelProto *m) {
    for (size_t i = 0; i < m->n_opset_import; i++) {
        const Onnx__OperatorSetIdProto *o = m->opset_import[i];
        if (!o->domain || !*o->domain || !strcmp(o->domain, "ai.onnx")) return (int)o->version;
    }
    (void)im;
    return 1;
}

/* An initializer's values, once read into its constant, are not read
 * again: its payload goes at once (freed through the unpacking allocator,
 * as protobuf-c would free it), so the model's weights are not held as
 * protobuf bytes and as constants at the same time (ResNet-18: 46 MB). */
#define DROP(field, count) (kfree(field), (field) = NULL, (count) = 0)
static void drop_payload(Onnx__TensorProto *t) {
    DROP(t->raw_data.data, t->raw_data.len);
    t->has_raw_data = 0;
    DROP(t->float_data, t->n_float_data);
    DROP(t->int32_data, t->n_int32_data);
    DROP(t->int64_data, t->n_int64_data);
    DROP(t->double_data, t->n_double_data);
    DROP(t->uint64_data, t->n_uint64_data);
}
#undef DROP

/* A large f32 initializer of rank 2 or 4 (a matmul's or a 2-D
 * convolution's weight) becomes a graph weight at once, straight from its
 * payload, and not an importer constant: its values as doubles (twice its
 * bytes) are never held (ddddocr: its 8210-class classifier, 34 MB of
 * doubles). Every op reading it takes it as a graph value, as MatMul, Gemm
 * and Conv take their weights anyway; nothing folds it at import
 * (exporters fold constants themselves). Ranks 3 and 5 (1-D and 3-D
 * convolution weights, which the importer reshapes into weights of their
 * own, and the recurrences') and external data keep the constant. */
#define DIRECT_WEIGHT_MIN ((int64_t)1 << 18)
static bool direct_weight(OxImp *im, const Onnx__TensorProto *t, OxVal *v) {
    int rank;
    int64_t shape[KILN_MAX_RANK], n;
    if (!t->name || !*t->name || !t->has_data_type || t->data_type != OT_FLOAT ||
        tensor_dims(t, &rank, shape, &n) || n < DIRECT_WEIGHT_MIN || (rank != 2 && rank != 4) ||
        (t->has_data_location && t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL))
        return false;
    bool raw = t->has_raw_data && t->raw_data.len == (size_t)n * sizeof(float);
    if (!raw && t->n_float_data != (size_t)n) return false; /* the constant path says why */
    float *f = NULL;
    v->type = OT_FLOAT;
    v->rank = rank;
    memcpy(v->shape, shape, sizeof(int64_t) * (size_t)rank);
    v->c = NULL;
    v->v = graph_weight_alloc(im->g, t->name, rank, shape, &f);
    if (v->v < 0) return false;
    memcpy(f, raw ? (const void *)t->raw_data.data : (const void *)t->float_data,
           sizeof(float) * (size_t)n); /* raw data is little-endian, as this machine */
    return true;
}

static bool add_initializers(OxImp *im, const Onnx__GraphProto *gp) {
    for (size_t i = 0; i < gp->n_initializer; i++) {
        Onnx__TensorProto *t = gp->initializer[i];
        OxVal *v = ox_val(im, t->name ? t->name : "");
        if (!v) return graph_fail(im->g, KILN_ERR_NOMEM, "out of memory"), false;
        if (!direct_weight(im, t, v)) {
            if (im->g->status != KILN_OK) return rewrap(im, "initializer%s", "");
            if (!ox_tensor_const(im, t, v)) return rewrap(im, "initializer%s", "");
        }
        drop_payload(t);
    }
    return true;
}

static const kiln_onnx_input *find_shape(const char *name, int n, const kiln_onnx_input *s) {
    for (int i = 0; i < n; i++)
        if (s[i].name && !strcmp(s[i].name, name)) return &s[i];
    return NULL;
}

static bool fixed_dim(const Onnx__TensorShapeProto__Dimension *d) {
    return d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE &&
           d->dim_value > 0;
}

/* A declared shape as "[1,3,H,W]": a symbolic dim by its name, else "?". */
static void declared_text(const Onnx__TensorShapeProto *sp, char *buf, size_t len) {
    size_t k = (size_t)snprintf(buf, len, "[");
    for (size_t i = 0; i < sp->n_dim && k < len; i++) {
        const Onnx__TensorShapeProto__Dimension *d = sp->dim[i];
        const char *sep = i ? "," : "";
        if (fixed_dim(d))
            k += (size_t)snprintf(buf + k, len - k, "%s%lld", sep, (long long)d->dim_value);
        else if (d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM &&
                 d->dim_param && *d->dim_param)
            k += (size_t)snprintf(buf + k, len - k, "%s%.40s", sep, d->dim_param);
        else
            k += (size_t)snprintf(buf + k, len - k, "%s?", sep);
    }
    if (k < len) snprintf(buf + k, len - k, "]");
}

static void shape_text(int rank, const int64_t *shape, char *buf, size_t len) {
    size_t k = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < rank && k < len; i++)
        k += (size_t)snprintf(buf + k, len - k, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (k < len) snprintf(buf + k, len - k, "]");
}

/* A shape given for input vi (--shape, an -i file, the C API) must keep
 * every dim the model fixes, as ONNX Runtime requires: only symbolic or
 * unknown dims take the given size. Inputs whose symbolic dims were set
 * are noted in im->given for later errors. */
static bool check_given(OxImp *im, const Onnx__ValueInfoProto *vi, const kiln_onnx_input *given) {
    const Onnx__TensorShapeProto *sp = vi->type->tensor_type->shape;
    if (!sp) return true;
    char want[200], got[200], msg[512];
    declared_text(sp, want, sizeof want);
    shape_text(given->rank, given->shape, got, sizeof got);
    bool free_dims = false;
    if (sp->n_dim != (size_t)given->rank) {
        util_fmt(msg, sizeof msg, "shape %s given, but the model declares %s (rank %d)", got, want,
                 (int)sp->n_dim);
        return fail(im, "input '%s': %s", vi->name, msg);
    }
    for (int i = 0; i < given->rank; i++) {
        const Onnx__TensorShapeProto__Dimension *d = sp->dim[i];
        free_dims |= !fixed_dim(d);
        if (fixed_dim(d) && d->dim_value != given->shape[i]) {
            util_fmt(msg, sizeof msg,
                     "shape %s given, but the model declares %s: dim %d is fixed at %lld (only "
                     "symbolic dims take the shape given)",
                     got, want, i, (long long)d->dim_value);
            return fail(im, "input '%s': %s", vi->name, msg);
        }
    }
    size_t k = strlen(im->given), add = strlen(vi->name) + strlen(got) + 3;
    if (free_dims && k + add < sizeof im->given) {
        memcpy(im->given + k, k ? ", " : "", k ? 2 : 0);
        k += k ? 2 : 0;
        memcpy(im->given + k, vi->name, strlen(vi->name));
        k += strlen(vi->name);
        im->given[k++] = ' ';
        memcpy(im->given + k, got, strlen(got) + 1);
    }
    return true;
}

/* The declared shape of input vi, with caller-given shapes taking over. */
static bool input_shape(OxImp *im, const Onnx__ValueInfoProto *vi, const kiln_onnx_input *given,
                        OxVal *v) {
    const Onnx__TensorShapeProto *sp = vi->type->tensor_type->shape;
    char hint[300];
    util_fmt(hint, sizeof hint, "; give its shape (kiln --shape %s=D0,D1,...)", vi->name);
    if (given) {
        v->rank = given->rank;
        memcpy(v->shape, given->shape, sizeof v->shape);
        return check_given(im, vi, given);
    }
    if (!sp) return fail(im, "input '%s' has no declared shape%s", vi->name, hint);
    if (sp->n_dim > KILN_MAX_RANK)
        return fail(im, "input '%s': unsupported: rank above 8%s", vi->name, "");
    v->rank = (int)sp->n_dim;
    for (int i = 0; i < v->rank; i++) {
        const Onnx__TensorShapeProto__Dimension *d = sp->dim[i];
        if (d->value_case != ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE ||
            d->dim_value <= 0)
            return fail(im, "input '%s' has a symbolic or unknown dim%s", vi->name, hint);
        v->shape[i] = d->dim_value;
    }
    return true;
}

/* Is element k of t an integer past 2^53 (which no double holds exactly)?
 * int64 and uint64 are read as they are; txt receives the value. */
static bool past_2p53(const kiln_tensor *t, int64_t k, char *txt, size_t len) {
    const int64_t lim = (int64_t)1 << 53;
    if (t->dtype == KILN_I64) {
        int64_t x = ((const int64_t *)t->data)[k];
        util_fmt(txt, len, "%lld", (long long)x);
        return x > lim || x < -lim;
    }
    if (t->dtype == KILN_U64) {
        uint64_t x = ((const uint64_t *)t->data)[k];
        util_fmt(txt, len, "%llu", (unsigned long long)x);
        return x > (uint64_t)lim;
    }
    double v = ox_tensor_elem(t, k);
    util_fmt(txt, len, "%.17g", v);
    return fabs(v) > 9007199254740992.0;
}

/* A specialized input. An int input becomes a constant: the shape
 * arithmetic it feeds folds. Others keep computing at run time, and the
 * value is read only where the import needs a constant. The kiln input
 * stays either way, for callers that pass every input. */
static bool set_value(OxImp *im, OxVal *v, const kiln_tensor *t) {
    int64_t n = ox_numel(v);
    if (t->rank != v->rank || kiln_tensor_numel(t) != n || !t->data)
        return fail(im, "input '%s': the value given does not have the input's shape%s", v->name,
                    "");
    double *d = arena_alloc(&im->arena, sizeof(double) * (size_t)(n ? n : 1));
    if (!d) return graph_fail(im->g, KILN_ERR_NOMEM, "out of memory"), false;
    for (int64_t k = 0; k < n; k++) {
        /* kiln holds integers in doubles: exact to 2^53 */
        char txt[32], at[64];
        if ((t->dtype == KILN_I64 || t->dtype == KILN_U64) && past_2p53(t, k, txt, sizeof txt)) {
            util_fmt(at, sizeof at, "element %lld is %s", (long long)k, txt);
            return fail(im, "input '%s': %s, beyond the integers kiln holds exactly (2^53)",
                        v->name, at);
        }
        d[k] = ox_tensor_elem(t, k);
    }
    *(v->type == OT_INT32 || v->type == OT_INT64 || !n ? &v->c : &v->spec) = d;
    return true;
}

static bool add_input(OxImp *im, const Onnx__ValueInfoProto *vi, int nshapes,
                      const kiln_onnx_input *shapes) {
    const char *name = vi->name ? vi->name : "";
    if (ox_find(im, name)) return true; /* an initializer listed as input: a constant */
    if (!vi->type || vi->type->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE ||
        !vi->type->tensor_type)
        return fail(im, "input '%s': unsupported: not a tensor%s", name, "");
    int type = vi->type->tensor_type->elem_type;
    if (type != OT_FLOAT && type != OT_DOUBLE && type != OT_BOOL && !ox_is_int_type(type) &&
        !ox_is_half_type(type))
        return fail(im, "input '%s': unsupported: element type %s (kiln computes in f32 and f64)",
                    name, ox_type_name(type));
    OxVal *v = ox_val(im, name);
    if (!v) return graph_fail(im->g, KILN_ERR_NOMEM, "out of memory"), false;
    v->type = type;
    const kiln_onnx_input *given = find_shape(name, nshapes, shapes);
    if (!input_shape(im, vi, given, v)) return false;
    v->v = kiln_input(im->g, name,
                      type == OT_BOOL                             ? KILN_BOOL
                      : type == OT_DOUBLE || ox_is_wide_int(type) ? KILN_F64
                                                                  : KILN_F32,
                      v->rank, v->shape);
    if (v->v < 0) return rewrap(im, "input '%s'", name);
    if (ox_numel(v) == 0) /* empty: its value (nothing) is known, a constant too */ {
        if (!(v->c = arena_alloc(&im->arena, sizeof(double))))
            return graph_fail(im->g, KILN_ERR_NOMEM, "out of memory"), false;
        return true;
    }
    return !given || !given->value || set_value(im, v, given->value);
}

/* Give a node's failure its place: file, node index, name and op. */
static void place_error(OxImp *im, const Onnx__NodeProto *np, int index) {
    char msg[1024];
    kiln_status st = im->g->status;
    util_fmt(msg, sizeof msg, "%s", kiln_error(im->g));
    graph_clear_error(im->g);
    if (!strncmp(msg, "unsupported op ", 15))
        graph_fail(im->g, st, "%s: %s", im->path, msg);
    else if (im->given[0] && st == KILN_ERR_INPUT) /* maybe from a shape given */
        graph_fail(im->g, st, "%s: node %d ('%s', %s): %s (with the shapes given: %s)", im->path,
                   index, np->name ? np->name : "", np->op_type ? np->op_type : "", msg, im->given);
    else
        graph_fail(im->g, st, "%s: node %d ('%s', %s): %s", im->path, index,
                   np->name ? np->name : "", np->op_type ? np->op_type : "", msg);
}

static bool convert_node(OxImp *im, const Onnx__NodeProto *np, int index) {
    OxNode n = {im, np, index, (int)np->n_input, NULL};
    n.in = arena_alloc(&im->arena, sizeof(OxVal *) * (np->n_input + 1));
    if (!n.in) return graph_fail(im->g, KILN_ERR_NOMEM, "out of memory"), false;
    for (size_t i = 0; i < np->n_input; i++) {
        if (!np->input[i][0]) continue;
        if (!(n.in[i] = ox_find(im, np->input[i]))) {
            graph_fail(im->g, KILN_ERR_INPUT, "input '%s' is not defined before this node",
                       np->input[i]);
            place_error(im, np, index);
            return false;
        }
    }
    bool ok = ox_convert(&n) && im->g->status == KILN_OK;
    if (!ok) place_error(im, np, index);
    return ok;
}

/* ---- If ----------------------------------------------------------------------- */

static bool unsupported_nodes(OxImp *im, const Onnx__GraphProto *gp, size_t from);

/* The nodes of a branch, converted into the importer's names (a branch
 * reads outer values by name; its own names must not repeat outer ones,
 * as ONNX requires). */
/* A subgraph's node outputs must be new names (kind: "branch", "body"),
 * then its initializers join the table. */
static bool fresh_names(OxImp *im, const Onnx__GraphProto *b, const char *kind) {
    for (size_t i = 0; i < b->n_node; i++)
        for (size_t k = 0; k < b->node[i]->n_output; k++) {
            const char *o = b->node[i]->output[k];
            if (*o && ox_find(im, o)) {
                char msg[400];
                util_fmt(msg, sizeof msg, "unsupported: the %s value '%s' repeats an outer name",
                         kind, o);
                return fail(im, "%s%s", msg, "");
            }
        }
    return add_initializers(im, b);
}

static bool convert_branch(OxImp *im, const Onnx__GraphProto *b, const char *which) {
    if (!b) return fail(im, "the %s is missing%s", which, "");
    if (!fresh_names(im, b, "branch")) return false;
    for (size_t i = 0; i < b->n_node; i++)
        if (!unsupported_nodes(im, b, i) || !convert_node(im, b->node[i], (int)i)) return false;
    return true;
}

static const Onnx__GraphProto *branch_attr(const OxNode *n, const char *name) {
    const Onnx__AttributeProto *a = ox_attr(n, name);
    return a ? a->g : NULL;
}

/* ---- control flow as compiled sub-programs -------------------------------------- */

/* How control flow is imported (KILN_CONTROL_FLOW): "auto" (unset: unroll a
 * Loop or Scan whose trip count is known and small, a where for an If whose
 * branches are cheap, otherwise sub-programs), "unroll" (never a
 * sub-program: kiln before them) or "call" (always sub-programs). */
typedef enum { CF_AUTO, CF_UNROLL, CF_CALL } CfMode;
enum {
    CF_UNROLL_NODES = 4096, /* auto: a Loop or Scan unrolls to at most this many nodes */
    CF_WHERE_NODES = 16,    /* auto: an If's two branches are a where up to this many nodes */
};

static bool cf_mode(OxNode *n, CfMode *m) {
    const char *e = getenv("KILN_CONTROL_FLOW");
    *m = !e || !*e || !strcmp(e, "auto") ? CF_AUTO
         : !strcmp(e, "unroll")          ? CF_UNROLL
         : !strcmp(e, "call")            ? CF_CALL
                                         : (CfMode)-1;
    if ((int)*m >= 0) return true;
    return ox_nfail(n, "KILN_CONTROL_FLOW is '%s': auto, unroll or call", e);
}

/* Nodes of a subgraph, its nested subgraphs' included; *heavy: one of them
 * is an op that costs more than a few instructions per element. */
static int64_t body_nodes(const Onnx__GraphProto *gp, bool *heavy) {
    static const char *const heavy_ops[] = {"Conv",   "ConvTranspose", "MatMul", "Gemm",
                                            "Einsum", "LSTM",          "GRU",    "RNN",
                                            "Loop",   "Scan",          "If"};
    int64_t count = 0;
    for (size_t i = 0; gp && i < gp->n_node; i++) {
        const Onnx__NodeProto *nd = gp->node[i];
        count++;
        for (size_t h = 0; heavy && h < sizeof heavy_ops / sizeof *heavy_ops; h++)
            if (nd->op_type && !strcmp(nd->op_type, heavy_ops[h])) *heavy = true;
        for (size_t a = 0; a < nd->n_attribute; a++) {
            const Onnx__AttributeProto *at = nd->attribute[a];
            if (at->g) count += body_nodes(at->g, heavy);
            for (size_t j = 0; j < at->n_graphs; j++) count += body_nodes(at->graphs[j], heavy);
        }
    }
    return count;
}

/* The names a subgraph defines (its inputs, initializers and node outputs,
 * and those of the subgraphs nested in it), in a table of their own. */
static bool scope_defines(OxImp *set, const Onnx__GraphProto *gp) {
    for (size_t i = 0; i < gp->n_input; i++)
        if (gp->input[i]->name && !ox_val(set, gp->input[i]->name)) return false;
    for (size_t i = 0; i < gp->n_initializer; i++)
        if (gp->initializer[i]->name && !ox_val(set, gp->initializer[i]->name)) return false;
    for (size_t i = 0; i < gp->n_node; i++) {
        const Onnx__NodeProto *nd = gp->node[i];
        for (size_t k = 0; k < nd->n_output; k++)
            if (nd->output[k][0] && !ox_val(set, nd->output[k])) return false;
        for (size_t a = 0; a < nd->n_attribute; a++) {
            const Onnx__AttributeProto *at = nd->attribute[a];
            if (at->g && !scope_defines(set, at->g)) return false;
            for (size_t j = 0; j < at->n_graphs; j++)
                if (!scope_defines(set, at->graphs[j])) return false;
        }
    }
    return true;
}

/* The names it reads that it does not define, each once, in order of use. */
typedef struct {
    OxImp seen;
    const char **names;
    int n, cap;
} NameList;

static bool note_read(NameList *l, OxImp *defs, const char *name) {
    if (!name[0] || ox_find(defs, name) || ox_find(&l->seen, name)) return true;
    if (!ox_val(&l->seen, name)) return false;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        const char **a = arena_alloc(&l->seen.arena, sizeof(char *) * (size_t)cap);
        if (!a) return false;
        if (l->n) memcpy(a, l->names, sizeof(char *) * (size_t)l->n);
        l->names = a, l->cap = cap;
    }
    l->names[l->n++] = name;
    return true;
}

static bool scope_reads(NameList *l, OxImp *defs, const Onnx__GraphProto *gp) {
    for (size_t i = 0; i < gp->n_node; i++) {
        const Onnx__NodeProto *nd = gp->node[i];
        for (size_t k = 0; k < nd->n_input; k++)
            if (!note_read(l, defs, nd->input[k])) return false;
        for (size_t a = 0; a < nd->n_attribute; a++) {
            const Onnx__AttributeProto *at = nd->attribute[a];
            if (at->g && !scope_reads(l, defs, at->g)) return false;
            for (size_t j = 0; j < at->n_graphs; j++)
                if (!scope_reads(l, defs, at->graphs[j])) return false;
        }
    }
    for (size_t k = 0; k < gp->n_output; k++)
        if (gp->output[k]->name && !note_read(l, defs, gp->output[k]->name)) return false;
    return true;
}

static void table_free(OxImp *t) {
    kfree(t->tab);
    arena_free(&t->arena);
}

/* Every name gp defines (scope_defines) out of scope; false when out of
 * memory. */
static bool forget_defined(OxImp *im, const Onnx__GraphProto *gp) {
    OxImp defs = {0};
    bool ok = scope_defines(&defs, gp);
    for (int i = 0; ok && i < defs.cap; i++)
        if (defs.tab[i]) ox_forget(im, defs.tab[i]->name);
    table_free(&defs);
    return ok;
}

/* A subgraph imported as a graph of its own (a sub-program). */
typedef struct {
    kiln_graph *g; /* its graph (owned until a call takes it) */
    int ncap;
    OxVal **cap;        /* the outer values it reads at run time: inputs after the bound ones */
    OxVal *out;         /* its outputs as values (type, rank, shape) */
    kiln_dtype *out_dt; /* their dtypes in the body, before the cast to the call's */
    kiln_value *out_v;  /* and their values there */
    kiln_value *in_v;   /* the bound inputs' values there, after the cast from the call's */
    bool f64;           /* a capture or an output is f64 */
} SubBody;

/* What a name in the importer's table was before a sub-program's scope. */
typedef struct {
    OxVal *slot;
    OxVal was;
    bool existed; /* else it leaves scope with the sub-program */
} Saved;

/* The outer values the body reads: a constant stays a constant (made a
 * weight of the body where read), a weight is copied into the body, any
 * other value becomes an input (a capture). */
static bool bind_outer(OxNode *n, kiln_graph *bg, Graph *pg, kiln_dtype dt, SubBody *sb,
                       OxVal *fv) {
    OxImp *im = n->im;
    if (fv->is_seq)
        return graph_fail(pg, KILN_ERR_INPUT,
                          "unsupported: the subgraph reads the sequence '%s' from outside",
                          fv->name),
               false;
    if (fv->c || fv->v < 0) {
        fv->v = KILN_NONE;
        return true;
    }
    const Node *pn = graph_node(pg, fv->v);
    if (pn->op == OP_WEIGHT) {
        fv->v = kiln_weight_typed(bg, pn->name ? pn->name : fv->name, pn->dtype, pn->rank,
                                  pn->shape, pn->data);
        return fv->v >= 0;
    }
    kiln_value x = kiln_input(bg, fv->name, dt, pn->rank, pn->shape);
    fv->v = kiln_cast(bg, x, pn->dtype);
    sb->f64 |= pn->dtype == KILN_F64;
    sb->cap[sb->ncap++] = fv;
    (void)im;
    return fv->v >= 0;
}

/* Import subgraph gp as a graph whose inputs are the nbound values bound[]
 * (their types and shapes; bdt[k] the dtype each has in the body), then
 * the outer values it reads, every input and output of dtype dt. The
 * importer's table is as before when it returns. */
static bool sub_import(OxNode *n, const Onnx__GraphProto *gp, const char *what, kiln_dtype dt,
                       int nbound, const OxVal *bound, const kiln_dtype *bdt, SubBody *sb) {
    OxImp *im = n->im;
    Graph *pg = im->g;
    memset(sb, 0, sizeof *sb);
    if ((int)gp->n_input != nbound)
        return ox_nfail(n, "the %s has %d inputs for %d", what, (int)gp->n_input, nbound);
    OxImp defs = {0};
    NameList reads;
    memset(&reads, 0, sizeof reads);
    int nout = (int)gp->n_output, nsaved = 0;
    bool ok = scope_defines(&defs, gp) && scope_reads(&reads, &defs, gp);
    Saved *saved =
        ok ? arena_alloc(&im->arena, sizeof(Saved) * (size_t)(defs.count + reads.n + 1)) : NULL;
    sb->cap = arena_alloc(&im->arena, sizeof(OxVal *) * (size_t)(reads.n + 1));
    sb->out = arena_alloc(&im->arena, sizeof(OxVal) * (size_t)(nout + 1));
    sb->out_dt = arena_alloc(&im->arena, sizeof(kiln_dtype) * (size_t)(nout + 1));
    sb->out_v = arena_alloc(&im->arena, sizeof(kiln_value) * (size_t)(nout + 1));
    sb->in_v = arena_alloc(&im->arena, sizeof(kiln_value) * (size_t)(nbound + 1));
    if (!saved || !sb->cap || !sb->out || !sb->out_dt || !sb->out_v || !sb->in_v ||
        !(sb->g = kiln_graph_new())) {
        table_free(&defs);
        table_free(&reads.seen);
        return ox_nomem(n);
    }
    kiln_graph *bg = sb->g;
    /* every name the body defines or reads, as it is outside */
    for (int i = 0; i < defs.cap; i++)
        if (defs.tab[i]) {
            OxVal *o = ox_find(im, defs.tab[i]->name);
            saved[nsaved++] = o ? (Saved){o, *o, true} : (Saved){NULL, {0}, false};
            if (!o) saved[nsaved - 1].was.name = defs.tab[i]->name;
        }
    int first_read = nsaved;
    for (int i = 0; i < reads.n; i++) {
        OxVal *o = ox_find(im, reads.names[i]);
        if (o) saved[nsaved++] = (Saved){o, *o, true};
    }
    im->g = bg;
    for (int k = 0; ok && k < nbound; k++) {
        const OxVal *b = &bound[k];
        const char *name = gp->input[k]->name ? gp->input[k]->name : "";
        char gen[32];
        util_fmt(gen, sizeof gen, "in%d", k);
        kiln_value x = kiln_input(bg, name[0] ? name : gen, dt, b->rank, b->shape);
        sb->in_v[k] = x = kiln_cast(bg, x, bdt[k]);
        OxVal *slot = ox_val(im, name);
        if (!slot || x < 0) {
            ok = false;
            break;
        }
        *slot = (OxVal){.name = slot->name, .type = b->type, .rank = b->rank, .v = x};
        memcpy(slot->shape, b->shape, sizeof b->shape);
    }
    for (int i = first_read; ok && i < nsaved; i++)
        ok = bind_outer(n, bg, pg, dt, sb, saved[i].slot);
    ok = ok && fresh_names(im, gp, what);
    for (size_t i = 0; ok && i < gp->n_node; i++)
        ok = unsupported_nodes(im, gp, i) && convert_node(im, gp->node[i], (int)i);
    for (int k = 0; ok && k < nout; k++) {
        const char *name = gp->output[k]->name ? gp->output[k]->name : "";
        OxVal *v = ox_find(im, name);
        if (!v || v->is_seq) {
            graph_fail(bg, KILN_ERR_INPUT,
                       v ? "unsupported: the %s's output '%s' is a sequence"
                         : "the %s does not compute its output '%s'",
                       what, name);
            ok = false;
            break;
        }
        kiln_value y = ox_graph_output(n, v);
        char gen[32];
        util_fmt(gen, sizeof gen, "out%d", k);
        ok = y >= 0;
        if (!ok) break;
        sb->out[k] = *v;
        sb->out_v[k] = y;
        sb->out_dt[k] = kiln_value_dtype(bg, y);
        sb->f64 |= sb->out_dt[k] == KILN_F64;
        ok = kiln_output(bg, kiln_cast(bg, y, dt), gen) == KILN_OK;
    }
    im->g = pg;
    if (!ok) {
        if (bg->status != KILN_OK)
            graph_fail(pg, bg->status, "%s", bg->err);
        else if (pg->status == KILN_OK)
            graph_nomem(pg);
    }
    /* the outer names as they were; the body's own out of scope */
    for (int i = nsaved - 1; i >= 0; i--) {
        if (saved[i].existed)
            *saved[i].slot = saved[i].was;
        else
            ox_forget(im, saved[i].was.name);
    }
    table_free(&defs);
    table_free(&reads.seen);
    if (!ok) {
        kiln_graph_free(sb->g);
        sb->g = NULL;
    }
    return ok;
}

static int64_t value_numel(Graph *g, kiln_value v) {
    return v >= 0 ? util_numel(kiln_value_rank(g, v), kiln_value_shape(g, v)) : 0;
}

/* The call's operand: the parts, each flattened and cast to dt, in order
 * (one unused element for none). */
static kiln_value pack(Graph *g, int nparts, kiln_value *parts, kiln_dtype dt) {
    int k = 0;
    for (int i = 0; i < nparts; i++) {
        int64_t numel = value_numel(g, parts[i]);
        if (parts[i] < 0 || numel > 0)
            parts[k++] = kiln_reshape(g, kiln_cast(g, parts[i], dt), 1, &numel);
    }
    if (k == 0) {
        int64_t one = 1;
        return kiln_reshape(g, kiln_cast(g, kiln_scalar(g, 0), dt), 1, &one);
    }
    return k == 1 ? parts[0] : kiln_concat(g, k, parts, 0);
}

/* Output k of the node: elements [off, off + numel) of the call's value,
 * shaped as v and cast to dt. */
static bool unpack(OxNode *n, int k, kiln_value call, int64_t off, const OxVal *v, int rank,
                   const int64_t *shape, kiln_dtype dt) {
    Graph *g = n->im->g;
    OxVal *o = ox_out_slot(n, k);
    if (!o) return true;
    int64_t numel = util_numel(rank, shape);
    if (numel == 0) { /* empty: a constant of nothing */
        const char *name = o->name;
        *o = (OxVal){.name = name, .type = v->type, .rank = rank, .v = KILN_NONE};
        memcpy(o->shape, shape, sizeof(int64_t) * (size_t)rank);
        o->c = arena_alloc(&n->im->arena, sizeof(double));
        return o->c || ox_nomem(n);
    }
    kiln_value y = kiln_slice(g, call, 0, off, off + numel, 1);
    y = kiln_cast(g, kiln_reshape(g, y, rank, shape), dt);
    return ox_set_graph(n, k, y, v->type);
}

/* A call's description, with its label. */
static GraphCall *new_call(OxNode *n, CallKind kind, const char *op) {
    GraphCall *c = kcalloc(1, sizeof *c);
    if (!c) return NULL;
    c->kind = kind;
    c->trips = -1;
    char label[200];
    util_fmt(label, sizeof label, "%s '%s' (node %d)", op, n->n->name ? n->n->name : "", n->index);
    c->label = arena_strdup(&n->im->g->arena, label);
    return c;
}

/* The body imported with the bound values, in f64 when anything it reads
 * or gives is f64 (else f32). */
static bool sub_import_typed(OxNode *n, const Onnx__GraphProto *gp, const char *what,
                             kiln_dtype *dt, int nbound, const OxVal *bound, const kiln_dtype *bdt,
                             SubBody *sb) {
    if (!sub_import(n, gp, what, *dt, nbound, bound, bdt, sb)) return false;
    if (*dt == KILN_F64 || !sb->f64) return true;
    kiln_graph_free(sb->g);
    *dt = KILN_F64;
    return sub_import(n, gp, what, *dt, nbound, bound, bdt, sb);
}

static bool same_shape(const OxVal *a, int rank, const int64_t *shape) {
    return a->rank == rank && !memcmp(a->shape, shape, sizeof(int64_t) * (size_t)rank);
}

/* Loop as a call: the body compiled once, run by the runtime while the trip
 * count (known, or the operand's) and the condition allow. Its scan outputs
 * need a size known at import: a known trip count, no start condition, and
 * a body condition that stays true (its input passed on, or a constant). */
static bool loop_call(OxNode *n, const Onnx__GraphProto *b, int ncar, int nscan) {
    OxImp *im = n->im;
    Graph *g = im->g;
    OxVal *mv = ox_in(n, 0), *cv = n->nin > 1 ? ox_in(n, 1) : NULL;
    GraphCall *c = new_call(n, CALL_LOOP, "Loop");
    kiln_value *parts = arena_alloc(&im->arena, sizeof(kiln_value) * (size_t)(ncar + 4));
    OxVal *bound = arena_alloc(&im->arena, sizeof(OxVal) * (size_t)(ncar + 2));
    kiln_dtype *bdt = arena_alloc(&im->arena, sizeof(kiln_dtype) * (size_t)(ncar + 2));
    if (!c || !parts || !bound || !bdt) return graph_call_free(c), ox_nomem(n);
    c->loop = true;
    int np = 0;
    if (mv && ox_known(mv) && ox_numel(mv) == 1) {
        c->trips = ox_to_i64(ox_known(mv)[0]);
        if (c->trips < 0) c->trips = 0;
        if (c->trips == INT64_MAX) c->trips = -1;
    } else if (mv) {
        c->has_trip = true;
        parts[np++] = ox_graph(n, mv);
    }
    if (cv && !(ox_known(cv) && ox_numel(cv) == 1 && ox_known(cv)[0] != 0)) {
        c->has_cond = true;
        parts[np++] = ox_graph(n, cv);
    }
    kiln_dtype dt = KILN_F32;
    bound[0] = (OxVal){.type = OT_INT64, .rank = 0};
    bound[1] = (OxVal){.type = OT_BOOL, .rank = 0};
    bdt[0] = KILN_F32, bdt[1] = KILN_BOOL;
    for (int k = 0; k < ncar; k++) {
        OxVal *s = ox_in(n, 2 + k);
        if (!s) return graph_call_free(c), ox_nfail(n, "loop-carried value %d is missing", k);
        kiln_value v = ox_graph(n, s);
        if (v < 0) return graph_call_free(c), false;
        bound[2 + k] = *s;
        bdt[2 + k] = kiln_value_dtype(g, v);
        if (bdt[2 + k] == KILN_F64) dt = KILN_F64;
        parts[np++] = v;
    }
    if (dt == KILN_F64) bdt[0] = KILN_F64;
    SubBody sb;
    if (!sub_import_typed(n, b, "body", &dt, ncar + 2, bound, bdt, &sb))
        return graph_call_free(c), false;
    c->body[0] = sb.g;
    c->nstate = ncar;
    c->nscan_out = nscan;
    bool cond_stays = sb.out_v[0] == sb.in_v[1] ||
                      (sb.out[0].c && ox_numel(&sb.out[0]) == 1 && sb.out[0].c[0] != 0);
    for (int k = 0; k < ncar; k++)
        if (!same_shape(&sb.out[1 + k], bound[2 + k].rank, bound[2 + k].shape) ||
            sb.out_dt[1 + k] != bdt[2 + k]) {
            graph_call_free(c);
            return ox_nfail(n,
                            "unsupported: loop-carried value %d changes its shape or type in "
                            "the body",
                            k);
        }
    if (nscan && (c->trips < 0 || c->has_cond || !cond_stays)) {
        const char *why = c->trips < 0  ? "its trip count is computed at run time"
                          : c->has_cond ? "its start condition is computed at run time"
                                        : "its body's condition is computed at run time";
        graph_call_free(c);
        return ox_nfail(n,
                        "unsupported: the loop's scan outputs have a size known only at run "
                        "time (%s)",
                        why);
    }
    if (c->trips < 0 && !c->has_trip && !c->has_cond && cond_stays) {
        graph_call_free(c);
        return ox_nfail(n, "the loop never ends: no trip count, and its condition stays true");
    }
    for (int k = 0; k < sb.ncap; k++) parts[np++] = ox_graph(n, sb.cap[k]);
    kiln_value call = graph_call(g, c, pack(g, np, parts, dt));
    if (call < 0) return false;
    int64_t off = 0;
    for (int k = 0; k < ncar; k++) {
        const OxVal *o = &sb.out[1 + k];
        if (!unpack(n, k, call, off, o, o->rank, o->shape, sb.out_dt[1 + k])) return false;
        off += ox_numel(o);
    }
    for (int k = 0; k < nscan; k++) {
        const OxVal *o = &sb.out[1 + ncar + k];
        int64_t s[KILN_MAX_RANK];
        if (o->rank + 1 > KILN_MAX_RANK)
            return ox_nfail(n, "scan output %d: rank %d exceeds %d", k, o->rank + 1, KILN_MAX_RANK);
        s[0] = c->trips;
        memcpy(s + 1, o->shape, sizeof(int64_t) * (size_t)o->rank);
        if (!unpack(n, ncar + k, call, off, o, o->rank + 1, s, sb.out_dt[1 + ncar + k]))
            return false;
        off += c->trips * ox_numel(o);
    }
    graph_note(g, "onnx: %s: its %d-node body compiled as a sub-program, run %s", c->label,
               (int)b->n_node,
               c->trips >= 0 ? "a known number of times" : "while its condition holds");
    return true;
}

/* Scan as a call: each scan input moved to its axis first, in iteration
 * order (reversed for a backward direction), as the operand holds it; each
 * scan output taken back to its axis and direction. xs, st: the inputs and
 * states, Scan-8's batch dim of one already dropped. */
static bool scan_call(OxNode *n, const Onnx__GraphProto *b, int N, OxVal *st, int M, OxVal *xs,
                      const int64_t *in_axes, const int64_t *in_dirs, int K,
                      const int64_t *out_axes, const int64_t *out_dirs, int64_t T, bool v8) {
    OxImp *im = n->im;
    Graph *g = im->g;
    GraphCall *c = new_call(n, CALL_LOOP, "Scan");
    kiln_value *parts = arena_alloc(&im->arena, sizeof(kiln_value) * (size_t)(N + M + 1));
    OxVal *bound = arena_alloc(&im->arena, sizeof(OxVal) * (size_t)(N + M + 1));
    kiln_dtype *bdt = arena_alloc(&im->arena, sizeof(kiln_dtype) * (size_t)(N + M + 1));
    if (!c || !parts || !bound || !bdt) return graph_call_free(c), ox_nomem(n);
    if (T < 1) return graph_call_free(c), ox_nfail(n, "unsupported: a scan of no steps");
    c->trips = T;
    kiln_dtype dt = KILN_F32;
    for (int k = 0; k < N + M; k++) {
        OxVal *v = k < N ? &st[k] : &xs[k - N];
        kiln_value x = ox_graph(n, v);
        if (x < 0) return graph_call_free(c), false;
        bound[k] = *v;
        if (k >= N) { /* the slice: the axis dropped, and the input moved to it first */
            int ax = (int)in_axes[k - N], perm[KILN_MAX_RANK], r = 0;
            perm[0] = ax;
            for (int d = 0; d < v->rank; d++)
                if (d != ax) bound[k].shape[r] = v->shape[d], perm[++r] = d;
            bound[k].rank = r;
            x = kiln_permute(g, x, v->rank, perm);
            if (in_dirs[k - N]) x = kiln_slice(g, x, 0, T - 1, -T - 1, -1);
        }
        bdt[k] = kiln_value_dtype(g, x);
        if (bdt[k] == KILN_F64) dt = KILN_F64;
        parts[k] = x;
    }
    SubBody sb;
    if (!sub_import_typed(n, b, "body", &dt, N + M, bound, bdt, &sb))
        return graph_call_free(c), false;
    c->body[0] = sb.g;
    c->nstate = N;
    c->nscan_in = M;
    c->nscan_out = K;
    for (int k = 0; k < N; k++)
        if (!same_shape(&sb.out[k], bound[k].rank, bound[k].shape) || sb.out_dt[k] != bdt[k]) {
            graph_call_free(c);
            return ox_nfail(n, "unsupported: state %d changes its shape or type in the body", k);
        }
    int np = N + M;
    for (int k = 0; k < sb.ncap; k++) parts[np++] = ox_graph(n, sb.cap[k]);
    kiln_value call = graph_call(g, c, pack(g, np, parts, dt));
    if (call < 0) return false;
    int64_t off = 0;
    for (int k = 0; k < N; k++) {
        const OxVal *o = &sb.out[k];
        int64_t s[KILN_MAX_RANK];
        int r = o->rank;
        memcpy(s + v8, o->shape, sizeof(int64_t) * (size_t)r);
        if (v8) s[0] = 1, r++;
        if (!unpack(n, k, call, off, o, r, s, sb.out_dt[k])) return false;
        off += ox_numel(o);
    }
    for (int k = 0; k < K; k++) {
        const OxVal *o = &sb.out[N + k];
        int64_t s[KILN_MAX_RANK], ax = v8 ? 0 : out_axes[k];
        int r = o->rank + 1;
        if (r + v8 > KILN_MAX_RANK)
            return ox_nfail(n, "scan output %d: rank %d exceeds %d", k, r + v8, KILN_MAX_RANK);
        if (ax < 0) ax += r;
        if (ax < 0 || ax >= r)
            return ox_nfail(n, "scan output axis %lld is out of range", (long long)ax);
        s[0] = T;
        memcpy(s + 1, o->shape, sizeof(int64_t) * (size_t)o->rank);
        if (!unpack(n, N + k, call, off, o, r, s, sb.out_dt[N + k])) return false;
        off += T * ox_numel(o);
        OxVal *y = ox_out_slot(n, N + k);
        if (!y) continue;
        if (y->c) { /* empty: the shape in its place */
            for (int d = 0, q = 0; d < r; d++) y->shape[d] = d == ax ? T : o->shape[q++];
            continue;
        }
        kiln_value v = y->v;
        if (out_dirs[k]) v = kiln_slice(g, v, 0, T - 1, -T - 1, -1);
        int perm[KILN_MAX_RANK], q = 0;
        for (int d = 0; d < r; d++) perm[d] = d == ax ? 0 : ++q;
        v = kiln_permute(g, v, r, perm);
        if (v8) {
            int64_t s1[KILN_MAX_RANK];
            s1[0] = 1;
            memcpy(s1 + 1, kiln_value_shape(g, v), sizeof(int64_t) * (size_t)r);
            v = kiln_reshape(g, v, r + 1, s1);
        }
        if (!ox_set_graph(n, N + k, v, y->type)) return false;
    }
    graph_note(g, "onnx: %s: its %d-node body compiled as a sub-program, run %lld times", c->label,
               (int)b->n_node, (long long)T);
    return true;
}

/* If as a call: both branches compiled, the runtime runs the one the
 * condition picks. Each output must have one type and one shape in both. */
static bool if_call(OxNode *n, const Onnx__GraphProto *tb, const Onnx__GraphProto *eb) {
    OxImp *im = n->im;
    Graph *g = im->g;
    int nout = (int)n->n->n_output;
    if (!tb || !eb) return ox_nfail(n, "the %s is missing", tb ? "else_branch" : "then_branch");
    if ((int)tb->n_output != nout || (int)eb->n_output != nout)
        return ox_nfail(n, "the branches have %d and %d outputs for %d", (int)tb->n_output,
                        (int)eb->n_output, nout);
    GraphCall *c = new_call(n, CALL_IF, "If");
    if (!c) return ox_nomem(n);
    kiln_dtype dt = KILN_F32;
    SubBody sb[2];
    const Onnx__GraphProto *gp[2] = {tb, eb};
    const char *which[2] = {"then_branch", "else_branch"};
    for (;;) { /* in f32, or again in f64 when either branch has f64 */
        for (int b = 0; b < 2; b++) {
            c->refused[b] = NULL;
            if (sub_import(n, gp[b], which[b], dt, 0, NULL, NULL, &sb[b])) {
                c->body[b] = sb[b].g;
                continue;
            }
            /* a branch that does not import at these shapes (a model's
             * other regime, as silero_vad's 8 kHz branch at 512 samples):
             * the run fails if it takes it; both refused: the import does */
            if (g->status != KILN_ERR_INPUT || (b == 1 && !c->body[0]))
                return graph_call_free(c), false;
            c->refused[b] = arena_strdup(&g->arena, g->err);
            graph_clear_error(g);
            if (!c->refused[b]) return graph_call_free(c), ox_nomem(n);
            memset(&sb[b], 0, sizeof sb[b]);
        }
        bool f64 = (c->body[0] && sb[0].f64) || (c->body[1] && sb[1].f64);
        if (dt == KILN_F64 || !f64) break;
        kiln_graph_free(c->body[0]);
        kiln_graph_free(c->body[1]);
        c->body[0] = c->body[1] = NULL;
        dt = KILN_F64;
    }
    int one = c->body[0] ? 0 : 1; /* a branch that imported */
    for (int k = 0; c->body[0] && c->body[1] && k < nout; k++) {
        const OxVal *a = &sb[0].out[k], *e = &sb[1].out[k];
        char sa[96], se[96];
        graph_shape_str(sa, sizeof sa, a->rank, a->shape);
        graph_shape_str(se, sizeof se, e->rank, e->shape);
        if (a->type != e->type || !same_shape(a, e->rank, e->shape)) {
            graph_call_free(c);
            return ox_nfail(n,
                            "unsupported: output %d is %s %s in the then_branch and %s %s in the "
                            "else_branch (kiln's shapes are static)",
                            k, ox_type_name(a->type), sa, ox_type_name(e->type), se);
        }
    }
    kiln_value *parts =
        arena_alloc(&im->arena, sizeof(kiln_value) * (size_t)(sb[0].ncap + sb[1].ncap + 1));
    if (!parts) return graph_call_free(c), ox_nomem(n);
    int np = 0;
    parts[np++] = ox_gin(n, 0);
    for (int b = 0; b < 2; b++)
        for (int k = 0; k < sb[b].ncap; k++) parts[np++] = ox_graph(n, sb[b].cap[k]);
    kiln_value call = graph_call(g, c, pack(g, np, parts, dt));
    if (call < 0) return false;
    int64_t off = 0;
    for (int k = 0; k < nout; k++) {
        const OxVal *o = &sb[one].out[k];
        kiln_dtype odt = sb[one].out_dt[k];
        if (c->body[0] && c->body[1] && sb[1 - one].out_dt[k] == KILN_F64) odt = KILN_F64;
        if (!unpack(n, k, call, off, o, o->rank, o->shape, odt)) return false;
        off += ox_numel(o);
    }
    graph_note(g,
               "onnx: %s: the condition is computed at run time; its branches (%d and %d nodes) "
               "compiled as sub-programs, the runtime runs one%s%s%s",
               c->label, (int)tb->n_node, (int)eb->n_node,
               c->refused[0] || c->refused[1] ? " (the " : "",
               c->refused[0]   ? "then_branch"
               : c->refused[1] ? "else_branch"
                               : "",
               c->refused[0] || c->refused[1]
                   ? " does not import at these shapes: a run that takes it fails)"
                   : "");
    return true;
}

/* If: a condition known at import (a constant, or an int input given with
 * -i that folded into one) takes its branch, and only that branch is
 * imported; otherwise both are, and each output is where(cond, then,
 * else): both branches are computed (kiln's ops have no side effects),
 * so their outputs must have one type and shapes that broadcast. */
static bool op_if(OxNode *n) {
    OxImp *im = n->im;
    OxVal *cv = ox_in(n, 0);
    if (!cv || ox_numel(cv) != 1) return ox_nfail(n, "the condition needs one element");
    const Onnx__GraphProto *tb = branch_attr(n, "then_branch"), *eb = branch_attr(n, "else_branch");
    int nout = (int)n->n->n_output;
    const char *nm = n->n->name ? n->n->name : "";
    if (cv->c) {
        const Onnx__GraphProto *b = cv->c[0] != 0 ? tb : eb;
        const char *which = cv->c[0] != 0 ? "then_branch" : "else_branch";
        if (!convert_branch(im, b, which)) return false;
        graph_note(im->g,
                   "onnx: If '%s' (node %d): the condition is known at import, only its %s "
                   "(%d nodes) is imported",
                   nm, n->index, which, (int)b->n_node);
        if ((int)b->n_output != nout)
            return ox_nfail(n, "the %s has %d outputs for %d", which, (int)b->n_output, nout);
        for (int k = 0; k < nout; k++) {
            OxVal *src = ox_find(im, b->output[k]->name ? b->output[k]->name : "");
            OxVal *dst = ox_out_slot(n, k);
            if (!src) return ox_nfail(n, "the %s does not compute its output %d", which, k);
            if (dst) {
                const char *name = dst->name;
                *dst = *src;
                dst->name = name;
            }
        }
        return true;
    }
    CfMode mode;
    if (!cf_mode(n, &mode)) return false;
    bool heavy = false;
    int64_t nodes = body_nodes(tb, &heavy) + body_nodes(eb, &heavy);
    if (mode == CF_CALL || (mode == CF_AUTO && (heavy || nodes > CF_WHERE_NODES)))
        return if_call(n, tb, eb);
    if (!convert_branch(im, tb, "then_branch") || !convert_branch(im, eb, "else_branch"))
        return false;
    graph_note(im->g,
               "onnx: If '%s' (node %d): the condition is computed at run time; both branches "
               "(%d and %d nodes) are imported and each output is a where between them",
               nm, n->index, (int)tb->n_node, (int)eb->n_node);
    if ((int)tb->n_output != nout || (int)eb->n_output != nout)
        return ox_nfail(n, "the branches have %d and %d outputs for %d", (int)tb->n_output,
                        (int)eb->n_output, nout);
    kiln_value c = ox_gin(n, 0);
    for (int k = 0; k < nout; k++) {
        OxVal *a = ox_find(im, tb->output[k]->name ? tb->output[k]->name : "");
        OxVal *b = ox_find(im, eb->output[k]->name ? eb->output[k]->name : "");
        if (!a || !b) return ox_nfail(n, "a branch does not compute its output %d", k);
        if (a->type != b->type)
            return ox_nfail(n, "unsupported: output %d has types %s and %s in the two branches", k,
                            ox_type_name(a->type), ox_type_name(b->type));
        kiln_value y = kiln_where(im->g, c, ox_graph(n, a), ox_graph(n, b));
        if (y < 0 || !ox_set_graph(n, k, y, a->type)) return false;
    }
    return true;
}

/* ---- Loop and Scan: the body unrolled ------------------------------------------ */

/* kiln's shapes are static and its programs have no loops of their own,
 * so a Loop whose trip count and condition are known at import, and a
 * Scan (its length is a shape), run their body once per iteration, each
 * iteration's nodes converted again with the body's inputs bound to the
 * state so far: the state lives in buffers the planner places like any
 * other, and each iteration's pointwise work fuses as the body allows.
 * Bounded by CF_MAX_ITERS, as the recurrences are. */
enum { CF_MAX_ITERS = 1024 };

/* Bind body input k to v (a copy under the body's name). */
static bool bind_input(OxImp *im, const Onnx__GraphProto *b, int k, const OxVal *v) {
    const char *name = b->input[k]->name ? b->input[k]->name : "";
    OxVal *slot = ox_val(im, name);
    if (!slot) return graph_fail(im->g, KILN_ERR_NOMEM, "out of memory"), false;
    *slot = *v;
    slot->name = name;
    return true;
}

/* Before a pass after the first: the names the last pass's nodes made
 * (those of their subgraphs too) leave scope, so that a branch or a body
 * nested in the body imports again as new. */
static bool forget_pass(OxImp *im, const Onnx__GraphProto *b) {
    bool ok = true;
    for (size_t i = 0; ok && i < b->n_node; i++) {
        const Onnx__NodeProto *nd = b->node[i];
        for (size_t k = 0; k < nd->n_output; k++)
            if (nd->output[k][0]) ox_forget(im, nd->output[k]);
        for (size_t a = 0; ok && a < nd->n_attribute; a++) {
            const Onnx__AttributeProto *at = nd->attribute[a];
            if (at->g) ok = forget_defined(im, at->g);
            for (size_t j = 0; ok && j < at->n_graphs; j++) ok = forget_defined(im, at->graphs[j]);
        }
    }
    return ok;
}

/* One pass of the body: its nodes converted again (the first pass checks
 * that its names do not repeat outer ones; later passes overwrite the
 * last pass's values). */
static bool body_pass(OxImp *im, const Onnx__GraphProto *b, bool first) {
    if (first && !fresh_names(im, b, "body")) return false;
    if (!first && !forget_pass(im, b)) return graph_nomem(im->g), false;
    int outer = im->pass;
    im->pass = ++im->npasses;
    for (size_t i = 0; i < b->n_node; i++)
        if ((first && !unsupported_nodes(im, b, i)) || !convert_node(im, b->node[i], (int)i))
            return im->pass = outer, false;
    im->pass = outer;
    return true;
}

/* Body output k, copied out (the next pass overwrites it). */
static bool body_output(OxNode *n, const Onnx__GraphProto *b, int k, OxVal *out) {
    OxVal *v = ox_find(n->im, b->output[k]->name ? b->output[k]->name : "");
    if (!v) return ox_nfail(n, "the body does not compute its output %d", k);
    *out = *v;
    return true;
}

/* The per-iteration values of one scan output stacked along axis (0 for
 * Loop): each gets a dim of 1 there, then one concat. */
static bool stack_output(OxNode *n, int k, OxVal *parts, int count, int axis, bool reverse) {
    Graph *g = n->im->g;
    if (count < 1)
        return ox_nfail(n, "unsupported: no iteration runs, and the scan output is empty (kiln "
                           "tensors are non-empty)");
    kiln_value *vs = arena_alloc(&n->im->arena, sizeof(kiln_value) * (size_t)count);
    if (!vs) return ox_nomem(n);
    int r = parts[0].rank;
    if (axis < 0) axis += r + 1;
    if (axis < 0 || axis > r) return ox_nfail(n, "scan output axis %d is out of range", axis);
    for (int i = 0; i < count; i++) {
        const OxVal *p = &parts[reverse ? count - 1 - i : i];
        if (p->rank != r || memcmp(p->shape, parts[0].shape, sizeof(int64_t) * (size_t)r))
            return ox_nfail(n, "unsupported: scan output %d changes shape between iterations", k);
        OxVal tmp = *p;
        if ((vs[i] = ox_insert_dim(n, &tmp, axis)) < 0) return false;
    }
    kiln_value y = count == 1 ? vs[0] : kiln_concat(g, count, vs, axis);
    return ox_set_graph(n, k, y, parts[0].type);
}

/* Loop: M (trip count) and cond, both optional, then the carried values;
 * the body takes (iteration, cond, carried...) and gives (cond, carried...,
 * scan outputs...). The condition must be known at import after every
 * iteration (a constant, or folded from constants and known inputs). */
static bool op_loop(OxNode *n) {
    OxImp *im = n->im;
    const Onnx__GraphProto *b = branch_attr(n, "body");
    if (!b) return ox_nfail(n, "the body is missing");
    OxVal *mv = ox_in(n, 0), *cv = n->nin > 1 ? ox_in(n, 1) : NULL;
    int ncar = n->nin - 2, nscan = (int)n->n->n_output - ncar;
    if (ncar < 0 || nscan < 0 || (int)b->n_input != ncar + 2 ||
        (int)b->n_output != ncar + 1 + nscan)
        return ox_nfail(n, "the body's inputs and outputs do not match the node's");
    CfMode mode;
    if (!cf_mode(n, &mode)) return false;
    bool known_m = !mv || (ox_known(mv) && ox_numel(mv) == 1);
    bool known_c = !cv || (ox_known(cv) && ox_numel(cv) == 1);
    if (mode == CF_CALL ||
        (mode == CF_AUTO &&
         (!mv || !known_m || !known_c || ox_to_i64(ox_known(mv)[0]) > CF_MAX_ITERS ||
          ox_to_i64(ox_known(mv)[0]) * body_nodes(b, NULL) > CF_UNROLL_NODES)))
        return loop_call(n, b, ncar, nscan);
    int64_t trips = CF_MAX_ITERS + 1;
    if (mv) {
        if (!ox_known(mv) || ox_numel(mv) != 1)
            return ox_nfail(n,
                            "unsupported: the trip count '%s' is computed at run time (kiln "
                            "unrolls a loop: give its value, kiln run -i %s=FILE)",
                            mv->name, mv->name);
        trips = ox_to_i64(ox_known(mv)[0]);
    }
    bool go = true;
    if (cv) {
        if (!ox_known(cv) || ox_numel(cv) != 1)
            return ox_nfail(n,
                            "unsupported: the loop condition '%s' is computed at run time "
                            "(kiln unrolls a loop whose condition is known at import: give its "
                            "value, kiln run -i %s=FILE)",
                            cv->name, cv->name);
        go = ox_known(cv)[0] != 0;
    }
    if (!mv && !cv)
        return ox_nfail(n, "unsupported: a loop with neither a trip count nor a condition");
    OxVal *car = arena_alloc(&im->arena, sizeof(OxVal) * (size_t)(ncar + 1));
    OxVal *scan = arena_alloc(&im->arena, sizeof(OxVal) * (size_t)(nscan * CF_MAX_ITERS + 1));
    if (!car || !scan) return ox_nomem(n);
    for (int k = 0; k < ncar; k++) car[k] = *ox_in(n, 2 + k);
    int it = 0;
    for (; go && it < trips; it++) {
        if (it == CF_MAX_ITERS)
            return ox_nfail(n, "unsupported: more than %d iterations (kiln unrolls loops)",
                            CF_MAX_ITERS);
        OxVal iv = {.type = OT_INT64, .rank = 0, .v = KILN_NONE};
        iv.c = arena_alloc(&im->arena, sizeof(double));
        OxVal cin = {.type = OT_BOOL, .rank = 0, .v = KILN_NONE};
        cin.c = arena_alloc(&im->arena, sizeof(double));
        if (!iv.c || !cin.c) return ox_nomem(n);
        iv.c[0] = (double)it, cin.c[0] = 1;
        if (!bind_input(im, b, 0, &iv) || !bind_input(im, b, 1, &cin)) return false;
        for (int k = 0; k < ncar; k++)
            if (!bind_input(im, b, 2 + k, &car[k])) return false;
        if (!body_pass(im, b, it == 0)) return false;
        OxVal cout;
        if (!body_output(n, b, 0, &cout)) return false;
        for (int k = 0; k < ncar; k++)
            if (!body_output(n, b, 1 + k, &car[k])) return false;
        for (int k = 0; k < nscan; k++)
            if (!body_output(n, b, 1 + ncar + k, &scan[k * CF_MAX_ITERS + it])) return false;
        /* the body's condition must fold; an Identity of cond_in does (it
         * was bound as the constant true) */
        if ((!ox_known(&cout) || ox_numel(&cout) != 1) && mode == CF_AUTO) {
            /* a sub-program after all: the passes so far are dead code */
            return forget_defined(im, b) ? loop_call(n, b, ncar, nscan) : ox_nomem(n);
        }
        if (!ox_known(&cout) || ox_numel(&cout) != 1)
            return ox_nfail(n, "unsupported: the body's condition is computed at run time "
                               "(kiln unrolls a loop whose condition folds at import)");
        go = ox_known(&cout)[0] != 0;
    }
    graph_note(im->g,
               "onnx: Loop '%s' (node %d): unrolled at import, %d passes of its %d-node body",
               n->n->name ? n->n->name : "", n->index, it, (int)b->n_node);
    for (int k = 0; k < ncar; k++) {
        OxVal *dst = ox_out_slot(n, k);
        if (dst) {
            const char *name = dst->name;
            *dst = car[k];
            dst->name = name;
        }
    }
    for (int k = 0; k < nscan; k++)
        if (ox_out_slot(n, ncar + k) &&
            !stack_output(n, ncar + k, scan + k * CF_MAX_ITERS, it, 0, false))
            return false;
    return true;
}

/* Scan (8 to 21): N state values and M scan inputs; the body runs once per
 * position along each scan input's axis (its scan_input_axes, reversed by
 * scan_input_directions), taking the states and the inputs' slices there
 * and giving the new states and K slices, stacked along
 * scan_output_axes (reversed by scan_output_directions). Opset 8's
 * form, with a batch dim first and sequence_lens, runs batches of one. */
static bool op_scan(OxNode *n) {
    OxImp *im = n->im;
    Graph *g = im->g;
    const Onnx__GraphProto *b = branch_attr(n, "body");
    if (!b) return ox_nfail(n, "the body is missing");
    bool v8 = im->opset < 9;
    int first = v8 ? 1 : 0, nin = n->nin - first;
    int M = (int)ox_attr_i(n, "num_scan_inputs", -1), N = nin - M;
    int K = (int)n->n->n_output - N;
    if (M < 1 || N < 0 || K < 0 || (int)b->n_input != N + M || (int)b->n_output != N + K)
        return ox_nfail(n, "num_scan_inputs, the inputs and the body do not match");
    for (int k = 0; k < nin; k++)
        if (!ox_in(n, first + k))
            return ox_nfail(n, "input %d (%s %d) is missing", first + k,
                            k < N ? "state" : "scan input", k < N ? k : k - N);
    if (v8) {
        if (ox_in(n, 0)) return ox_nfail(n, "unsupported: Scan-8 with sequence_lens");
        for (int k = 0; k < nin; k++)
            if (ox_in(n, first + k)->rank < 1 || ox_in(n, first + k)->shape[0] != 1)
                return ox_nfail(n, "unsupported: Scan-8 with a batch other than 1");
    }
    int64_t in_axes[64] = {0}, in_dirs[64] = {0}, out_axes[64] = {0}, out_dirs[64] = {0};
    if (M > 64 || K > 64) return ox_nfail(n, "unsupported: more than 64 scan inputs or outputs");
    if (ox_attr_ints(n, "scan_input_axes", in_axes, 64) == -2 ||
        ox_attr_ints(n, v8 ? "directions" : "scan_input_directions", in_dirs, 64) == -2 ||
        ox_attr_ints(n, "scan_output_axes", out_axes, 64) == -2 ||
        ox_attr_ints(n, "scan_output_directions", out_dirs, 64) == -2)
        return false;
    /* the scan inputs' slices: (the batch dim of one dropped for Scan-8) */
    int64_t T = -1;
    OxVal *xs = arena_alloc(&im->arena, sizeof(OxVal) * (size_t)M);
    OxVal *st = arena_alloc(&im->arena, sizeof(OxVal) * (size_t)(N + 1));
    OxVal *outs = arena_alloc(&im->arena, sizeof(OxVal) * (size_t)(K * CF_MAX_ITERS + 1));
    if (!xs || !st || !outs) return ox_nomem(n);
    for (int k = 0; k < N + M; k++) {
        OxVal v = *ox_in(n, first + k);
        if (v8) { /* drop the batch dim */
            int64_t s[KILN_MAX_RANK];
            for (int d = 1; d < v.rank; d++) s[d - 1] = v.shape[d];
            v.v = kiln_reshape(g, ox_graph(n, &v), v.rank - 1, s);
            v.c = NULL;
            v.rank--;
            memcpy(v.shape, s, sizeof(int64_t) * (size_t)v.rank);
        }
        if (k < N) {
            st[k] = v;
            continue;
        }
        int64_t ax = v8 ? 0 : in_axes[k - N];
        if (!ox_norm_axis(n, &ax, v.rank)) return false;
        in_axes[k - N] = ax;
        if (T >= 0 && v.shape[ax] != T)
            return ox_nfail(n, "the scan inputs have lengths %lld and %lld", (long long)T,
                            (long long)v.shape[ax]);
        T = v.shape[ax];
        xs[k - N] = v;
    }
    CfMode mode;
    if (!cf_mode(n, &mode)) return false;
    if (mode == CF_CALL ||
        (mode == CF_AUTO && (T > CF_MAX_ITERS || T * body_nodes(b, NULL) > CF_UNROLL_NODES)))
        return scan_call(n, b, N, st, M, xs, in_axes, in_dirs, K, out_axes, out_dirs, T, v8);
    if (T > CF_MAX_ITERS)
        return ox_nfail(n, "unsupported: %lld steps (kiln unrolls Scan, up to %d)", (long long)T,
                        CF_MAX_ITERS);
    for (int64_t t = 0; t < T; t++) {
        for (int k = 0; k < N; k++)
            if (!bind_input(im, b, k, &st[k])) return false;
        for (int m = 0; m < M; m++) {
            OxVal *x = &xs[m];
            int ax = (int)in_axes[m];
            int64_t at = in_dirs[m] ? T - 1 - t : t, s[KILN_MAX_RANK];
            int r = 0;
            for (int d = 0; d < x->rank; d++)
                if (d != ax) s[r++] = x->shape[d];
            OxVal sl = {.name = x->name, .type = x->type, .rank = r, .v = KILN_NONE};
            memcpy(sl.shape, s, sizeof(int64_t) * (size_t)r);
            sl.v = kiln_reshape(g, kiln_slice(g, ox_graph(n, x), ax, at, at + 1, 1), r, s);
            if (sl.v < 0 || !bind_input(im, b, N + m, &sl)) return false;
        }
        if (!body_pass(im, b, t == 0)) return false;
        for (int k = 0; k < N; k++)
            if (!body_output(n, b, k, &st[k])) return false;
        for (int k = 0; k < K; k++)
            if (!body_output(n, b, N + k, &outs[k * CF_MAX_ITERS + t])) return false;
    }
    graph_note(g, "onnx: Scan '%s' (node %d): unrolled at import, %lld passes of its %d-node body",
               n->n->name ? n->n->name : "", n->index, (long long)T, (int)b->n_node);
    for (int k = 0; k < N; k++) {
        kiln_value v = ox_graph(n, &st[k]);
        if (v8) {
            int64_t s[KILN_MAX_RANK];
            s[0] = 1;
            memcpy(s + 1, st[k].shape, sizeof(int64_t) * (size_t)st[k].rank);
            v = kiln_reshape(g, v, st[k].rank + 1, s);
        }
        if (ox_out_slot(n, k) && !ox_set_graph(n, k, v, st[k].type)) return false;
    }
    for (int k = 0; k < K; k++) {
        if (!ox_out_slot(n, N + k)) continue;
        if (!stack_output(n, N + k, outs + k * CF_MAX_ITERS, (int)T, v8 ? 0 : (int)out_axes[k],
                          out_dirs[k] != 0))
            return false;
        if (v8) { /* the batch dim of one back in front */
            OxVal *o = ox_out_slot(n, N + k);
            int64_t s[KILN_MAX_RANK];
            s[0] = 1;
            memcpy(s + 1, o->shape, sizeof(int64_t) * (size_t)o->rank);
            if (!ox_set_graph(n, N + k, kiln_reshape(g, o->v, o->rank + 1, s), o->type))
                return false;
        }
    }
    return true;
}

/* Control flow's handlers (onnx_ops.c looks ops up here too). */
const OxHandler ox_control_ops[] = {
    {"If", op_if},
    {"Loop", op_loop},
    {"Scan", op_scan},
};
const size_t ox_control_nops = sizeof ox_control_ops / sizeof ox_control_ops[0];

static bool mark_outputs(OxImp *im, const Onnx__GraphProto *gp, kiln_dtype *types) {
    for (size_t i = 0; i < gp->n_output; i++) {
        const char *name = gp->output[i]->name ? gp->output[i]->name : "";
        OxVal *v = ox_find(im, name);
        if (!v) return fail(im, "output '%s' is not computed by any node%s", name, "");
        if (v->is_seq)
            return fail(im, "output '%s': unsupported: a sequence (kiln's outputs are tensors)%s",
                        name, "");
        int kt = kiln_type(v->type);
        if (kt < 0)
            return fail(im, "output '%s': unsupported: element type %s", name,
                        ox_type_name(v->type));
        types[i] = (kiln_dtype)kt;
        OxNode n = {im, NULL, -1, 0, NULL};
        kiln_value gv = ox_graph_output(&n, v);
        if (gv < 0 || kiln_output(im->g, gv, name) != KILN_OK)
            return rewrap(im, "output '%s'", name);
    }
    return true;
}

/* When node `from` has an op the importer lacks: every such node from
 * there on, named at once (op, index, node name), so that a user learns
 * the whole list from one try; one such node keeps the short form. The
 * nodes before are converted first, so an error of theirs comes first. */
static bool unsupported_nodes(OxImp *im, const Onnx__GraphProto *gp, size_t from) {
    const Onnx__NodeProto *at = gp->node[from];
    if (ox_supported(at->domain ? at->domain : "", at->op_type ? at->op_type : "")) return true;
    char list[900];
    size_t k = 0;
    int count = 0, listed = 0;
    const Onnx__NodeProto *first = NULL;
    int first_i = -1;
    list[0] = 0;
    for (size_t i = from; i < gp->n_node; i++) {
        const Onnx__NodeProto *np = gp->node[i];
        const char *op = np->op_type ? np->op_type : "";
        const char *dom = np->domain ? np->domain : "";
        if (ox_supported(dom, op)) continue;
        if (!count++) first = np, first_i = (int)i;
        if (k + 120 < sizeof list) {
            k += (size_t)snprintf(list + k, sizeof list - k, "%s%s%s%.40s at node %d ('%.40s')",
                                  listed ? ", " : "", *dom && strcmp(dom, "ai.onnx") ? dom : "",
                                  *dom && strcmp(dom, "ai.onnx") ? "." : "", op, (int)i,
                                  np->name ? np->name : "");
            listed++;
        }
    }
    if (!count) return true;
    char msg[1100];
    if (count == 1) {
        const char *dom = first->domain && strcmp(first->domain, "ai.onnx") ? first->domain : "";
        util_fmt(msg, sizeof msg, "unsupported op %s%s%s (opset %d) at node %d ('%s')", dom,
                 *dom ? "." : "", first->op_type ? first->op_type : "", im->opset, first_i,
                 first->name ? first->name : "");
    } else if (listed < count) {
        util_fmt(msg, sizeof msg, "unsupported ops (opset %d) at %d nodes: %s, and %d more",
                 im->opset, count, list, count - listed);
    } else {
        util_fmt(msg, sizeof msg, "unsupported ops (opset %d) at %d nodes: %s", im->opset, count,
                 list);
    }
    return fail(im, "%s%s", msg, "");
}

/* Subgraphs (If's branches, Loop's and Scan's bodies) nest at most this
 * deep: the import walks them recursively. */
enum { OX_MAX_NESTING = 64 };

static bool nesting_ok(const Onnx__GraphProto *gp, int depth) {
    if (depth > OX_MAX_NESTING) return false;
    for (size_t i = 0; i < gp->n_node; i++)
        for (size_t a = 0; a < gp->node[i]->n_attribute; a++) {
            const Onnx__AttributeProto *at = gp->node[i]->attribute[a];
            if (at->g && !nesting_ok(at->g, depth + 1)) return false;
            for (size_t j = 0; j < at->n_graphs; j++)
                if (!nesting_ok(at->graphs[j], depth + 1)) return false;
        }
    return true;
}

static bool import_graph(OxImp *im, const Onnx__ModelProto *m, int nshapes,
                         const kiln_onnx_input *shapes, kiln_onnx_io *io) {
    const Onnx__GraphProto *gp = m->graph;
    char ver[32];
    if (!gp) return fail(im, "the model has no graph%s%s", "", "");
    util_fmt(ver, sizeof ver, "%d", OX_MAX_NESTING);
    if (!nesting_ok(gp, 0))
        return fail(im, "unsupported: subgraphs nested more than %s deep%s", ver, "");
    im->graph = gp;
    im->opset = find_opset(im, m);
    util_fmt(ver, sizeof ver, "%d", im->opset);
    if (im->opset < 1 || im->opset > 21)
        return fail(im, "unsupported opset %s (kiln reads opsets 1 to 21)%s", ver, "");
    if (!add_initializers(im, gp)) return false;
    for (size_t i = 0; i < gp->n_input; i++)
        if (!add_input(im, gp->input[i], nshapes, shapes)) return false;
    for (size_t i = 0; i < gp->n_node; i++)
        if (!unsupported_nodes(im, gp, i) || !convert_node(im, gp->node[i], (int)i)) return false;
    kiln_dtype *types =
        arena_alloc(&im->g->arena, sizeof(kiln_dtype) * (gp->n_input + gp->n_output + 1));
    if (!types) return graph_fail(im->g, KILN_ERR_NOMEM, "out of memory"), false;
    if (!mark_outputs(im, gp, types + gp->n_input)) return false;
    int k = 0;
    for (size_t i = 0; i < gp->n_input; i++) {
        OxVal *v = ox_find(im, gp->input[i]->name ? gp->input[i]->name : "");
        if (v && v->v >= 0 && graph_node(im->g, v->v)->op == OP_INPUT)
            types[k++] = (kiln_dtype)kiln_type(v->type);
    }
    if (io) *io = (kiln_onnx_io){k, (int)gp->n_output, types, types + gp->n_input};
    return true;
}

/* Is now the same file as was (read first): device, inode, size, mtime? */
static bool same_file(const struct stat *now, const struct stat *was) {
    return was && now->st_dev == was->st_dev && now->st_ino == was->st_ino &&
           now->st_size == was->st_size && now->st_mtim.tv_sec == was->st_mtim.tv_sec &&
           now->st_mtim.tv_nsec == was->st_mtim.tv_nsec;
}

/* Keep the model's bytes in g (kiln_program_run imports it again at other
 * shapes): a copy of data, or, when data is NULL, the file read again if
 * it is still the one read first (was). */
static void keep_model(kiln_graph *g, const void *data, size_t len, const char *filename,
                       const struct stat *was) {
    size_t nl = strlen(filename) + 1;
    unsigned char *bytes = NULL;
    size_t n = len;
    char err[64];
    kiln_status st;
    struct stat now;
    if (data && (bytes = kmalloc(len ? len : 1))) memcpy(bytes, data, len);
    if (!data && (!read_file(filename, &bytes, &n, err, sizeof err, &st, &now) ||
                  !same_file(&now, was) || n != len)) {
        kfree(bytes); /* changed under us: fixed shape only */
        bytes = NULL;
    }
    g->model_name = bytes ? kmalloc(nl) : NULL;
    if (bytes && g->model_name) {
        memcpy(g->model_name, filename, nl);
        g->model = bytes;
        g->model_len = len;
    } else {
        kfree(bytes);
        kfree(g->model_name);
        g->model = NULL, g->model_name = NULL; /* fixed shape only */
    }
}

/* Import from memory. *owned (may be NULL), when set, is data's kmalloc'd
 * buffer, which the import frees as soon as the model is unpacked (from a
 * file, kept bytes are read again at the end): the model's bytes are not
 * held beside its weights. */
static kiln_status import_buffer(kiln_graph *g, const void *data, size_t len, const char *filename,
                                 int nshapes, const kiln_onnx_input *shapes, kiln_onnx_io *io,
                                 unsigned char **owned, const struct stat *was) {
    if (g->status != KILN_OK) return g->status;
    if (g->n)
        return graph_fail(g, KILN_ERR_INPUT, "%s: import into a graph that is not empty", filename),
               g->status;
    bool oom = false;
    ProtobufCAllocator pb_allocator = {pb_alloc, pb_free, &oom};
    Onnx__ModelProto *m = onnx__model_proto__unpack(&pb_allocator, len, data);
    if (owned) { /* protobuf-c copied what it keeps */
        kfree(*owned);
        *owned = NULL;
        data = NULL;
    }
    if (!m && oom) return graph_fail(g, KILN_ERR_NOMEM, "%s: out of memory", filename), g->status;
    if (!m) {
        graph_fail(g, KILN_ERR_INPUT,
                   "%s: not a valid ONNX model (the protobuf message is "
                   "malformed or truncated)",
                   filename);
        return g->status;
    }
    OxImp im = {.g = g, .path = filename};
    import_graph(&im, m, nshapes, shapes, io);
    /* symbolic dims took given shapes and no input was specialized to a
     * value: the program may import the model again at other shapes */
    bool values = false;
    for (int i = 0; i < nshapes; i++) values |= shapes[i].value != NULL;
    bool keep = g->status == KILN_OK && im.given[0] && !values;
    onnx__model_proto__free_unpacked(m, &pb_allocator);
    arena_free(&im.arena);
    kfree(im.tab);
    if (keep) keep_model(g, data, len, filename, was); /* after the import's memory went */
    return g->status;
}

kiln_status kiln_onnx_import_buffer(kiln_graph *g, const void *data, size_t len,
                                    const char *filename, int nshapes,
                                    const kiln_onnx_input *shapes, kiln_onnx_io *io) {
    return import_buffer(g, data, len, filename, nshapes, shapes, io, NULL, NULL);
}

kiln_status kiln_onnx_import(kiln_graph *g, const char *path, int nshapes,
                             const kiln_onnx_input *shapes, kiln_onnx_io *io) {
    unsigned char *data;
    size_t len;
    char err[1024];
    kiln_status st;
    if (g->status != KILN_OK) return g->status;
    struct stat was;
    if (!read_file(path, &data, &len, err, sizeof err, &st, &was))
        return graph_fail(g, st, "%s", err), g->status;
    st = import_buffer(g, data, len, path, nshapes, shapes, io, &data, was.st_ino ? &was : NULL);
    kfree(data); /* NULL unless the import stopped before unpacking */
    return st;
}

/* ---- .pb tensors ------------------------------------------------------------ */

kiln_status kiln_pb_read(const char *path, kiln_tensor *out, char *err, size_t errlen) {
    unsigned char *data;
    size_t len;
    kiln_status st;
    memset(out, 0, sizeof *out);
    if (!read_file(path, &data, &len, err, errlen, &st, NULL)) return st;
    bool oom = false;
    ProtobufCAllocator pb_allocator = {pb_alloc, pb_free, &oom};
    Onnx__TensorProto *t = onnx__tensor_proto__unpack(&pb_allocator, len, data);
    kfree(data);
    if (!t && oom) return util_fmt(err, errlen, "%s: out of memory", path), KILN_ERR_NOMEM;
    if (!t) {
        util_fmt(err, errlen,
                 "%s: not a valid ONNX tensor (the protobuf message is malformed "
                 "or truncated)",
                 path);
        return KILN_ERR_INPUT;
    }
    int64_t n = 0;
    int kt = kiln_type(t->data_type);
    const char *why = tensor_dims(t, &out->rank, out->shape, &n);
    if (!why && kt < 0) why = "unsupported element type";
    double *vals = why ? NULL : kmalloc(sizeof(double) * (size_t)(n ? n : 1));
    if (!why && !vals) why = "out of memory";
    if (!why) why = tensor_values(NULL, t, n, vals);
    if (!why) {
        out->dtype = (kiln_dtype)kt;
        if (kiln_tensor_alloc(out) != KILN_OK) why = "out of memory";
    }
    for (int64_t k = 0; !why && k < n; k++) set_elem(out, k, vals[k]);
    /* 64-bit integers exactly (a double holds them only to 2^53) */
    if (!why && (kt == KILN_I64 || kt == KILN_U64) && n > 0) {
        if (t->has_raw_data && t->raw_data.len == (size_t)n * 8)
            memcpy(out->data, t->raw_data.data, (size_t)n * 8);
        else if (kt == KILN_I64 && t->n_int64_data == (size_t)n)
            memcpy(out->data, t->int64_data, (size_t)n * 8);
        else if (kt == KILN_U64 && t->n_uint64_data == (size_t)n)
            memcpy(out->data, t->uint64_data, (size_t)n * 8);
    }
    if (why)
        util_fmt(err, errlen, "%s: tensor of type %s: %s", path, ox_type_name(t->data_type), why);
    if (why) kiln_tensor_free(out);
    kfree(vals);
    onnx__tensor_proto__free_unpacked(t, &pb_allocator);
    return why ? (strcmp(why, "out of memory") ? KILN_ERR_INPUT : KILN_ERR_NOMEM) : KILN_OK;
}

static const int onnx_of_dtype[] = {
    [KILN_F32] = OT_FLOAT,    [KILN_F64] = OT_DOUBLE, [KILN_I32] = OT_INT32,
    [KILN_I64] = OT_INT64,    [KILN_BOOL] = OT_BOOL,  [KILN_I8] = OT_INT8,
    [KILN_U8] = OT_UINT8,     [KILN_I16] = OT_INT16,  [KILN_U16] = OT_UINT16,
    [KILN_U32] = OT_UINT32,   [KILN_U64] = OT_UINT64, [KILN_F16] = OT_FLOAT16,
    [KILN_BF16] = OT_BFLOAT16};

kiln_status kiln_pb_write(const char *path, const kiln_tensor *t, const char *name, char *err,
                          size_t errlen) {
    Onnx__TensorProto tp = ONNX__TENSOR_PROTO__INIT;
    int64_t dims[KILN_MAX_RANK];
    for (int i = 0; i < t->rank; i++) dims[i] = t->shape[i];
    tp.n_dims = (size_t)t->rank;
    tp.dims = dims;
    tp.has_data_type = 1;
    tp.data_type = onnx_of_dtype[t->dtype];
    tp.name = (char *)(name ? name : "");
    tp.has_raw_data = 1;
    tp.raw_data.len = (size_t)kiln_tensor_numel(t) * kiln_dtype_size(t->dtype);
    tp.raw_data.data = t->data;
    size_t n = onnx__tensor_proto__get_packed_size(&tp);
    uint8_t *buf = kmalloc(n ? n : 1);
    if (!buf) return util_fmt(err, errlen, "%s: out of memory", path), KILN_ERR_NOMEM;
    onnx__tensor_proto__pack(&tp, buf);
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(buf, 1, n, f) == n;
    if (f && fclose(f) != 0) ok = false;
    kfree(buf);
    if (!ok) util_fmt(err, errlen, "%s: cannot write: %s", path, strerror(errno));
    return ok ? KILN_OK : KILN_ERR_ENV;
}

/* ---- converting at the boundary ------------------------------------------- */

double ox_tensor_elem(const kiln_tensor *t, int64_t k) {
    switch (t->dtype) {
    case KILN_F32: return ((const float *)t->data)[k];
    case KILN_F64: return ((const double *)t->data)[k];
    case KILN_I32: return ((const int32_t *)t->data)[k];
    case KILN_I64: return (double)((const int64_t *)t->data)[k];
    case KILN_BOOL: return ((const uint8_t *)t->data)[k];
    case KILN_I8: return ((const int8_t *)t->data)[k];
    case KILN_U8: return ((const uint8_t *)t->data)[k];
    case KILN_I16: return ((const int16_t *)t->data)[k];
    case KILN_U16: return ((const uint16_t *)t->data)[k];
    case KILN_U32: return ((const uint32_t *)t->data)[k];
    case KILN_U64: return (double)((const uint64_t *)t->data)[k];
    case KILN_F16: return util_f16_to_f32(((const uint16_t *)t->data)[k]);
    case KILN_BF16: return util_bf16_to_f32(((const uint16_t *)t->data)[k]);
    }
    return 0;
}

static bool is_int(kiln_dtype d) {
    return d == KILN_I32 || d == KILN_I64 || (d >= KILN_I8 && d <= KILN_U64);
}

/* The range of an integer dtype. */
static void int_range(kiln_dtype d, double *lo, double *hi) {
    static const double r[][2] = {[KILN_I32] = {-2147483648.0, 2147483647.0},
                                  [KILN_I64] = {-9.2233720368547758e18, 9.2233720368547758e18},
                                  [KILN_I8] = {-128, 127},
                                  [KILN_U8] = {0, 255},
                                  [KILN_I16] = {-32768, 32767},
                                  [KILN_U16] = {0, 65535},
                                  [KILN_U32] = {0, 4294967295.0},
                                  [KILN_U64] = {0, 1.8446744073709552e19}};
    *lo = r[d][0], *hi = r[d][1];
}

kiln_status kiln_tensor_convert(const kiln_tensor *src, kiln_dtype to, kiln_tensor *dst, char *err,
                                size_t errlen) {
    *dst = *src;
    dst->dtype = to;
    dst->data = NULL;
    if (kiln_tensor_alloc(dst) != KILN_OK)
        return util_fmt(err, errlen, "out of memory"), KILN_ERR_NOMEM;
    bool exact = (is_int(src->dtype) && to == KILN_F32) || (src->dtype == KILN_F32 && is_int(to));
    bool exact64 = is_int(src->dtype) && to == KILN_F64;
    int64_t n = kiln_tensor_numel(src);
    for (int64_t k = 0; k < n; k++) {
        double v = ox_tensor_elem(src, k);
        if (exact && (fabs(v) > 16777216.0 || v != floor(v))) {
            util_fmt(err, errlen,
                     "element %lld is %.17g: not an integer kiln's f32 holds "
                     "exactly (|v| <= 2^24)",
                     (long long)k, v);
            kiln_tensor_free(dst);
            return KILN_ERR_INPUT;
        }
        char txt[32];
        if (exact64 && past_2p53(src, k, txt, sizeof txt)) {
            util_fmt(err, errlen,
                     "element %lld is %s: not an integer kiln's f64 holds exactly (|v| <= 2^53)",
                     (long long)k, txt);
            kiln_tensor_free(dst);
            return KILN_ERR_INPUT;
        }
        double lo, hi;
        if (is_int(to) && (int_range(to, &lo, &hi), !(v >= lo && v <= hi && v == floor(v)))) {
            util_fmt(err, errlen, "element %lld is %.17g: not a value of %s", (long long)k, v,
                     kiln_dtype_name(to));
            kiln_tensor_free(dst);
            return KILN_ERR_INPUT;
        }
        set_elem(dst, k, v);
    }
    return KILN_OK;
}
