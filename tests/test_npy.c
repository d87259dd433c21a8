/*
 * test_npy.c -- .npy reading and writing.
 *
 * The oracle is NumPy: tests/npy/gen.py saved the fixtures in tests/npy/
 * from fixed values that are spelled out again here, so kiln must read
 * them to exactly those values, write byte-identical files for the same
 * arrays, and reject the kinds NumPy can write but kiln does not support.
 * Corrupt files are built byte by byte in the scratch directory, and each
 * rejection checks the status and a key phrase of the message.
 */
#include "test.h"
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- helpers --------------------------------------------------------- */

/* A path in a small rotating pool, so a few can be alive at once. */
static const char *pathf(const char *dir, const char *name) {
    static char pool[8][1024];
    static int next;
    char *p = pool[next++ % 8];
    size_t d = strlen(dir), n = strlen(name);
    if (d + n + 2 > sizeof pool[0]) {
        fprintf(stderr, "path too long\n");
        abort();
    }
    memmove(p, dir, d);
    p[d] = '/';
    memcpy(p + d + 1, name, n + 1);
    return p;
}

static const char *fixture(const char *name) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/npy", test_srcdir());
    return pathf(dir, name);
}

static const char *tmp(const char *name) { return pathf(test_tmpdir(), name); }

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* The whole file, malloc'd (test code may use the C library directly). */
static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    rewind(f);
    unsigned char *buf = malloc(size > 0 ? (size_t)size : 1);
    *n = buf && size >= 0 ? fread(buf, 1, (size_t)size, f) : 0;
    fclose(f);
    return buf;
}

static void write_raw(const char *path, const void *bytes, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(bytes, 1, n, f) != n) test_failf(__FILE__, __LINE__, "cannot write %s", path);
    if (f) fclose(f);
}

/* Build a .npy file in the scratch dir: magic, version major.0, the header
 * length for that version, the header text exactly as given, then data. */
static const char *make_npy(const char *name, int major, const char *header, const void *data,
                            size_t n) {
    unsigned char buf[4096];
    size_t h = strlen(header), at = 0;
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)major;
    buf[7] = 0;
    at = 8;
    for (int i = 0; i < (major == 1 ? 2 : 4); i++) buf[at++] = (unsigned char)(h >> (8 * i));
    memcpy(buf + at, header, h);
    memcpy(buf + at + h, data, n);
    const char *p = tmp(name);
    write_raw(p, buf, at + h + n);
    return p;
}

/* Names in the scratch dir that contain ".tmp." (left-over temporaries). */
static int count_temporaries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, ".tmp.") != NULL;
    if (d) closedir(d);
    return n;
}

/* Reading path must fail with status st, a message naming the file and
 * holding phrase, and no allocation left in the tensor. */
#define REJECT(path, st, phrase) reject(__LINE__, path, st, phrase)
static void reject(int line, const char *path, kiln_status st, const char *phrase) {
    kiln_tensor t;
    char err[512] = "";
    kiln_status got = kiln_npy_read(path, &t, err, sizeof err);
    if (got != st) test_failf(__FILE__, line, "%s: status %d, want %d (%s)", path, got, st, err);
    if (!strstr(err, phrase))
        test_failf(__FILE__, line, "message \"%s\" lacks \"%s\"", err, phrase);
    if (strncmp(err, path, strlen(path)) != 0)
        test_failf(__FILE__, line, "message \"%s\" does not name %s", err, path);
    if (t.data) {
        test_failf(__FILE__, line, "data left allocated");
        kiln_tensor_free(&t);
    }
}

/* Read path, expecting success with this dtype and shape. */
static bool read_ok(int line, const char *path, kiln_tensor *t, kiln_dtype dt, int rank,
                    const int64_t *shape) {
    char err[512] = "";
    if (kiln_npy_read(path, t, err, sizeof err) != KILN_OK) {
        test_failf(__FILE__, line, "reading %s failed: %s", path, err);
        return false;
    }
    bool same = t->dtype == dt && t->rank == rank;
    for (int i = 0; same && i < rank; i++) same = t->shape[i] == shape[i];
    if (!same) {
        test_failf(__FILE__, line, "%s: dtype %d rank %d, want %d rank %d (or shape differs)", path,
                   t->dtype, t->rank, dt, rank);
        kiln_tensor_free(t);
    }
    return same;
}
#define READ_OK(path, t, dt, rank, ...) \
    read_ok(__LINE__, path, t, dt, rank, (const int64_t[]){__VA_ARGS__})

/* ---- reading files NumPy wrote ----------------------------------------- */

/* The arrays gen.py saves, as C literals. */
static const float f32_2x3[] = {-1, -0.5f, 0, 0.5f, 1, 1.5f};
static const double f64_4[] = {0.1, -2.5, 1e300, -0.0};
static const int32_t i32_3x1x2[] = {-3, -2, -1, 0, 1, 2};
static const int64_t i64_5[] = {INT64_MIN, -1, 0, 1, INT64_MAX};
static const unsigned char bool_2x2[] = {1, 0, 0, 1};
static const float f32_rank0[] = {3.25f};
static const float v2_f32_3[] = {0, 1, 2};
static const double v3_f64_2x2[] = {0.5, 1.5, 2.5, 3.5};

TEST(npy_numpy_f32) {
    kiln_tensor t;
    if (!READ_OK(fixture("f32_2x3.npy"), &t, KILN_F32, 2, 2, 3)) return;
    EXPECT(memcmp(t.data, f32_2x3, sizeof f32_2x3) == 0, "f32 values differ");
    kiln_tensor_free(&t);
}

TEST(npy_numpy_f64) {
    kiln_tensor t;
    if (!READ_OK(fixture("f64_4.npy"), &t, KILN_F64, 1, 4)) return;
    EXPECT(memcmp(t.data, f64_4, sizeof f64_4) == 0, "f64 values differ");
    EXPECT(signbit(((double *)t.data)[3]), "-0.0 lost its sign");
    kiln_tensor_free(&t);
}

TEST(npy_numpy_i32) {
    kiln_tensor t;
    if (!READ_OK(fixture("i32_3x1x2.npy"), &t, KILN_I32, 3, 3, 1, 2)) return;
    EXPECT(memcmp(t.data, i32_3x1x2, sizeof i32_3x1x2) == 0, "i32 values differ");
    kiln_tensor_free(&t);
}

TEST(npy_numpy_i64) {
    kiln_tensor t;
    if (!READ_OK(fixture("i64_5.npy"), &t, KILN_I64, 1, 5)) return;
    EXPECT(memcmp(t.data, i64_5, sizeof i64_5) == 0, "i64 values differ");
    kiln_tensor_free(&t);
}

TEST(npy_numpy_bool) {
    kiln_tensor t;
    if (!READ_OK(fixture("bool_2x2.npy"), &t, KILN_BOOL, 2, 2, 2)) return;
    EXPECT(memcmp(t.data, bool_2x2, sizeof bool_2x2) == 0, "bool values differ");
    kiln_tensor_free(&t);
}

TEST(npy_numpy_rank0) {
    kiln_tensor t;
    if (!READ_OK(fixture("f32_rank0.npy"), &t, KILN_F32, 0, 0)) return;
    EXPECT(*(float *)t.data == 3.25f, "rank-0 value %g", *(float *)t.data);
    kiln_tensor_free(&t);
}

TEST(npy_numpy_version2) {
    kiln_tensor t;
    if (!READ_OK(fixture("v2_f32_3.npy"), &t, KILN_F32, 1, 3)) return;
    EXPECT(memcmp(t.data, v2_f32_3, sizeof v2_f32_3) == 0, "v2 values differ");
    kiln_tensor_free(&t);
}

TEST(npy_numpy_version3) {
    kiln_tensor t;
    if (!READ_OK(fixture("v3_f64_2x2.npy"), &t, KILN_F64, 2, 2, 2)) return;
    EXPECT(memcmp(t.data, v3_f64_2x2, sizeof v3_f64_2x2) == 0, "v3 values differ");
    kiln_tensor_free(&t);
}

/* np.arange(3, dtype=np.float16), written by NumPy: half bit patterns. */
TEST(npy_numpy_f16) {
    kiln_tensor t;
    if (!READ_OK(fixture("f16_3.npy"), &t, KILN_F16, 1, 3)) return;
    const uint16_t *h = t.data;
    EXPECT(h[0] == 0 && h[1] == 0x3c00 && h[2] == 0x4000, "f16 bits %04x %04x %04x", h[0], h[1],
           h[2]);
    kiln_tensor_free(&t);
}

TEST(npy_numpy_rejected) {
    REJECT(fixture("fortran_f32_2x3.npy"), KILN_ERR_INPUT,
           "Fortran-order arrays are not supported; save with np.ascontiguousarray");
    REJECT(fixture("bigendian_f32_3.npy"), KILN_ERR_INPUT, "big-endian data is not supported");
    REJECT(fixture("c64_2.npy"), KILN_ERR_INPUT, "unsupported dtype '<c8'");
    REJECT(fixture("structured_2.npy"), KILN_ERR_INPUT, "structured dtypes");
    REJECT(fixture("structured_utf8_v3.npy"), KILN_ERR_INPUT, "structured dtypes");
}

/* An empty array, as NumPy saves one: read with its shape, written back
 * byte for byte the same. */
TEST(npy_numpy_empty) {
    kiln_tensor t;
    if (!READ_OK(fixture("empty_0x3.npy"), &t, KILN_F32, 2, 0, 3)) return;
    EXPECT(kiln_tensor_numel(&t) == 0, "%lld elements", (long long)kiln_tensor_numel(&t));
    kiln_tensor_free(&t);
}

/* ---- writing: byte-identical to np.save --------------------------------- */

/* Write t and compare the file with the fixture NumPy saved. */
static void same_as_numpy(int line, const char *name, kiln_dtype dt, int rank, const int64_t *shape,
                          const void *data) {
    kiln_tensor t = {dt, rank, {0}, (void *)data};
    memcpy(t.shape, shape, sizeof(int64_t) * (size_t)rank);
    char err[512] = "";
    const char *out = tmp(name);
    if (kiln_npy_write(out, &t, err, sizeof err) != KILN_OK) {
        test_failf(__FILE__, line, "write %s: %s", name, err);
        return;
    }
    size_t na = 0, nb = 0;
    unsigned char *a = slurp(out, &na), *b = slurp(fixture(name), &nb);
    if (!a || !b || na != nb || memcmp(a, b, na) != 0)
        test_failf(__FILE__, line, "%s: %zu bytes differ from NumPy's %zu", name, na, nb);
    free(a);
    free(b);
}
#define SAME_AS_NUMPY(name, dt, data, rank, ...) \
    same_as_numpy(__LINE__, name, dt, rank, (const int64_t[]){__VA_ARGS__}, data)

TEST(npy_write_matches_numpy) {
    SAME_AS_NUMPY("f32_2x3.npy", KILN_F32, f32_2x3, 2, 2, 3);
    SAME_AS_NUMPY("f64_4.npy", KILN_F64, f64_4, 1, 4);
    SAME_AS_NUMPY("i32_3x1x2.npy", KILN_I32, i32_3x1x2, 3, 3, 1, 2);
    SAME_AS_NUMPY("i64_5.npy", KILN_I64, i64_5, 1, 5);
    SAME_AS_NUMPY("bool_2x2.npy", KILN_BOOL, bool_2x2, 2, 2, 2);
    SAME_AS_NUMPY("f32_rank0.npy", KILN_F32, f32_rank0, 0, 0);
    SAME_AS_NUMPY("empty_0x3.npy", KILN_F32, NULL, 2, 0, 3);
}

/* ---- round trips ------------------------------------------------------- */

/* Distinct values of every dtype, with the awkward ones first. */
static void fill(kiln_tensor *t, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        switch (t->dtype) {
        case KILN_F32:
            ((float *)t->data)[i] = i == 0   ? -0.0f
                                    : i == 1 ? (float)NAN
                                    : i == 2 ? -(float)INFINITY
                                             : 1e-40f * (float)i - 3.7f * (float)i;
            break;
        case KILN_F64:
            ((double *)t->data)[i] = i == 0   ? -0.0
                                     : i == 1 ? NAN
                                     : i == 2 ? INFINITY
                                              : 1e-310 - 1e300 / (double)i;
            break;
        case KILN_I32:
            ((int32_t *)t->data)[i] = i == 0 ? INT32_MIN : (int32_t)(i * 977 - 20000);
            break;
        case KILN_I64:
            ((int64_t *)t->data)[i] = i == 0 ? INT64_MIN : i * 1000000007 * 1000 - 1;
            break;
        case KILN_BOOL: ((unsigned char *)t->data)[i] = (i * 7) % 3 == 0; break;
        case KILN_I8: ((int8_t *)t->data)[i] = i == 0 ? INT8_MIN : (int8_t)(i * 37 - 100); break;
        case KILN_U8: ((uint8_t *)t->data)[i] = i == 0 ? UINT8_MAX : (uint8_t)(i * 37); break;
        case KILN_I16:
            ((int16_t *)t->data)[i] = i == 0 ? INT16_MIN : (int16_t)(i * 977 - 20000);
            break;
        case KILN_U16: ((uint16_t *)t->data)[i] = i == 0 ? UINT16_MAX : (uint16_t)(i * 977); break;
        case KILN_U32:
            ((uint32_t *)t->data)[i] = i == 0 ? UINT32_MAX : (uint32_t)i * 1000000007u;
            break;
        case KILN_U64:
            ((uint64_t *)t->data)[i] = i == 0 ? UINT64_MAX : (uint64_t)i * 1000000007000ull;
            break;
        case KILN_F16: /* bit patterns: -0, NaN, -inf, then others */
        case KILN_BF16:
            ((uint16_t *)t->data)[i] = i == 0   ? 0x8000
                                       : i == 1 ? 0x7e01
                                       : i == 2 ? 0xfc00
                                                : (uint16_t)(i * 4099);
            break;
        }
    }
}

/* Write and read back one tensor; the data must start at a multiple of 64
 * after a header ending in '\n', and no temporary may be left behind. */
static void round_trip(kiln_dtype dt, int rank, const int64_t *shape) {
    kiln_tensor t = {dt, rank, {0}, NULL}, back;
    memcpy(t.shape, shape, sizeof(int64_t) * (size_t)rank);
    if (kiln_tensor_alloc(&t) != KILN_OK) {
        test_failf(__FILE__, __LINE__, "alloc");
        return;
    }
    int64_t n = kiln_tensor_numel(&t);
    size_t bytes = (size_t)n * kiln_dtype_size(dt);
    fill(&t, n);
    char err[512] = "", name[64];
    snprintf(name, sizeof name, "rt_%s_%d.npy", kiln_dtype_name(dt), rank);
    const char *p = tmp(name);
    EXPECT(kiln_npy_write(p, &t, err, sizeof err) == KILN_OK, "write %s: %s", name, err);
    if (read_ok(__LINE__, p, &back, dt, rank, shape)) {
        EXPECT(memcmp(back.data, t.data, bytes) == 0, "%s: data differs", name);
        kiln_tensor_free(&back);
    }
    size_t size = 0;
    unsigned char *file = slurp(p, &size);
    EXPECT(file && size > bytes && (size - bytes) % 64 == 0 && file[size - bytes - 1] == '\n',
           "%s: data does not start at a multiple of 64 after '\\n'", name);
    free(file);
    EXPECT(count_temporaries(test_tmpdir()) == 0, "%s: a temporary was left", name);
    kiln_tensor_free(&t);
}

static void round_trip_ranks(kiln_dtype dt) {
    static const int64_t shapes[][6] = {{0}, {7}, {2, 3, 4}, {1, 2, 1, 3, 2, 2}};
    static const int ranks[] = {0, 1, 3, 6};
    for (int i = 0; i < 4; i++) round_trip(dt, ranks[i], shapes[i]);
}

TEST(npy_roundtrip_f32) { round_trip_ranks(KILN_F32); }
TEST(npy_roundtrip_f64) { round_trip_ranks(KILN_F64); }
TEST(npy_roundtrip_i32) { round_trip_ranks(KILN_I32); }
TEST(npy_roundtrip_i64) { round_trip_ranks(KILN_I64); }
TEST(npy_roundtrip_bool) { round_trip_ranks(KILN_BOOL); }
TEST(npy_roundtrip_narrow_and_unsigned) {
    static const kiln_dtype dts[] = {KILN_I8,  KILN_U8,  KILN_I16, KILN_U16,
                                     KILN_U32, KILN_U64, KILN_F16};
    for (int i = 0; i < 7; i++) round_trip_ranks(dts[i]);
}

/* numpy has no bfloat16: writing one is refused, and no file is left. */
TEST(npy_write_bf16_refused) {
    uint16_t v[2] = {0x3f80, 0x4000};
    kiln_tensor t = {KILN_BF16, 1, {2}, v};
    char err[256] = "";
    const char *p = tmp("bf16.npy");
    EXPECT(kiln_npy_write(p, &t, err, sizeof err) == KILN_ERR_INPUT && strstr(err, "bfloat16"),
           "bf16 written: %s", err);
    EXPECT(access(p, F_OK) != 0 && count_temporaries(test_tmpdir()) == 0, "a file was left");
}

/* numpy's descrs of the narrow and unsigned kinds ('|' for one byte), read
 * as those dtypes with their values. */
TEST(npy_read_numpy_narrow_descrs) {
    static const struct {
        const char *hdr;
        kiln_dtype dt;
        double want1;
    } cases[] = {
        {"{'descr': '|u1', 'fortran_order': False, 'shape': (2,), }\n", KILN_U8, 255},
        {"{'descr': '|i1', 'fortran_order': False, 'shape': (2,), }\n", KILN_I8, -1},
        {"{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }\n", KILN_U16, 65535},
        {"{'descr': '<i2', 'fortran_order': False, 'shape': (2,), }\n", KILN_I16, -1},
    };
    for (int i = 0; i < 4; i++) {
        char name[32];
        snprintf(name, sizeof name, "narrow%d.npy", i);
        size_t es = kiln_dtype_size(cases[i].dt);
        /* element 0 is 7, element 1 all ones */
        unsigned char d[4] = {7, 0, 0xff, 0xff};
        if (es == 1) d[1] = 0xff;
        const char *p = make_npy(name, 1, cases[i].hdr, d, 2 * es);
        kiln_tensor t;
        char err[256];
        CHECK(kiln_npy_read(p, &t, err, sizeof err) == KILN_OK);
        EXPECT(t.dtype == cases[i].dt && t.rank == 1 && t.shape[0] == 2, "%s: dtype %s",
               cases[i].hdr, kiln_dtype_name(t.dtype));
        kiln_tensor f;
        CHECK(kiln_tensor_convert(&t, KILN_F64, &f, err, sizeof err) == KILN_OK);
        EXPECT(((double *)f.data)[0] == 7 && ((double *)f.data)[1] == cases[i].want1,
               "%s: values %g %g", cases[i].hdr, ((double *)f.data)[0], ((double *)f.data)[1]);
        kiln_tensor_free(&f);
        kiln_tensor_free(&t);
    }
}

/* Converting to an integer type checks its range (f32 300 is no uint8). */
TEST(tensor_convert_integer_range) {
    float v[3] = {255, 300, -1};
    kiln_tensor t = {KILN_F32, 1, {1}, v}, o;
    char err[256];
    CHECK(kiln_tensor_convert(&t, KILN_U8, &o, err, sizeof err) == KILN_OK);
    EXPECT(((uint8_t *)o.data)[0] == 255, "255 as u8");
    kiln_tensor_free(&o);
    t.data = v + 1;
    EXPECT(kiln_tensor_convert(&t, KILN_U8, &o, err, sizeof err) == KILN_ERR_INPUT &&
               strstr(err, "not a value of u8"),
           "300 as u8: %s", err);
    t.data = v + 2;
    EXPECT(kiln_tensor_convert(&t, KILN_U16, &o, err, sizeof err) == KILN_ERR_INPUT,
           "-1 as u16 accepted");
    EXPECT(kiln_tensor_convert(&t, KILN_I8, &o, err, sizeof err) == KILN_OK &&
               ((int8_t *)o.data)[0] == -1,
           "-1 as i8");
    kiln_tensor_free(&o);
}

TEST(npy_roundtrip_large_dims) {
    /* Long dims make the longest header the writer produces (rank 6). */
    kiln_tensor t = {KILN_BOOL, 6, {1000000, 1, 1, 1, 1, 1}, NULL};
    round_trip(t.dtype, t.rank, t.shape);
}

/* ---- hand-made corrupt files ------------------------------------------- */

static const char hdr_f4_2x3[] = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n";
static const unsigned char zeros[64];

TEST(npy_reject_bad_magic) {
    const char *p = make_npy("magic.npy", 1, hdr_f4_2x3, zeros, 24);
    size_t n = 0;
    unsigned char *b = slurp(p, &n);
    CHECK(b && n > 6);
    b[5] = 'Z'; /* \x93NUMPZ */
    write_raw(p, b, n);
    free(b);
    REJECT(p, KILN_ERR_INPUT, "not a .npy file");
    write_raw(tmp("empty.npy"), "", 0);
    REJECT(tmp("empty.npy"), KILN_ERR_INPUT, "not a .npy file");
    write_raw(tmp("text.npy"), "hello, world\n", 13);
    REJECT(tmp("text.npy"), KILN_ERR_INPUT, "not a .npy file");
}

TEST(npy_reject_version) {
    REJECT(make_npy("v4.npy", 4, hdr_f4_2x3, zeros, 24), KILN_ERR_INPUT,
           "unsupported .npy format version 4.0");
    unsigned char b[] = "\x93NUMPY\x01\x01\x00\x00";
    write_raw(tmp("v11.npy"), b, 10);
    REJECT(tmp("v11.npy"), KILN_ERR_INPUT, "unsupported .npy format version 1.1");
}

TEST(npy_reject_truncated_header) {
    write_raw(tmp("th1.npy"), "\x93NUMPY\x01", 7);
    REJECT(tmp("th1.npy"), KILN_ERR_INPUT, "truncated header");
    write_raw(tmp("th2.npy"), "\x93NUMPY\x02\x00\x10\x00", 10);
    REJECT(tmp("th2.npy"), KILN_ERR_INPUT, "truncated header");
    /* The length says 118 bytes; only 20 follow. */
    write_raw(tmp("th3.npy"), "\x93NUMPY\x01\x00\x76\x00{'descr': '<f4', 'fo", 30);
    REJECT(tmp("th3.npy"), KILN_ERR_INPUT, "truncated header: expected 118 bytes, found 20");
    /* A huge claimed length is refused before anything is allocated. */
    write_raw(tmp("th4.npy"), "\x93NUMPY\x02\x00\x00\x00\x00\x40{", 13);
    REJECT(tmp("th4.npy"), KILN_ERR_INPUT, "header of 1073741824 bytes is too large");
}

/* A header that must be refused, and the phrase saying why. */
static const struct {
    const char *header, *phrase;
} bad_headers[] = {
    {"[1, 2]\n", "malformed header: expected a dict literal"},
    {"", "malformed header: expected a dict literal"},
    {"{'descr': '<f4', 'fortran_order': False, }\n", "missing key 'shape'"},
    {"{'fortran_order': False, 'shape': (2, 3)}\n", "missing key 'descr'"},
    {"{'descr': '<f4', 'shape': (2, 3)}\n", "missing key 'fortran_order'"},
    {"{}\n", "missing key 'descr'"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}\n", "unexpected key 'x'"},
    {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}\n",
     "duplicate key 'descr'"},
    {"{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 3)}\n",
     "'fortran_order' must be True or False"},
    {"{'descr': '<f4', 'fortran_order': false, 'shape': (2, 3)}\n",
     "'fortran_order' must be True or False"},
    {"{'descr': <f4, 'fortran_order': False, 'shape': (2, 3)}\n", "'descr' must be a dtype string"},
    {"{'descr': '<f4, 'fortran_order': False, 'shape': (2, 3)}\n", "expected ',' or '}'"},
    {"{'descr' '<f4', 'fortran_order': False, 'shape': (2, 3)}\n",
     "expected ':' after key 'descr'"},
    {"{descr: '<f4', 'fortran_order': False, 'shape': (2, 3)}\n", "expected a quoted string"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (6)}\n", "(6) is not a tuple"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3]}\n", "tuple of integers"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, x)}\n", "tuple of integers"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (2.0, 3)}\n", "expected ',' or ')'"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (,)}\n", "tuple of integers"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3)}\n", "negative dimension -3"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}\n",
     "a dimension in 'shape' is too large"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296)}\n",
     "shape (4294967296, 4294967296) is too large"},
    {"{'descr': '<f4' 'fortran_order': False, 'shape': (2, 3)}\n", "expected ',' or '}'"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)\n", "expected ',' or '}'"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)} x\n",
     "unexpected text after the closing '}'"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}}\n",
     "unexpected text after the closing '}'"},
    {"{'fortran_order': False, 'shape': (2, 3), 'descr': [('a', '<f4'),\n", "unterminated list"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x\n': 1}\n",
     "unterminated string"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1)}\n",
     "rank 9 is more than kiln's maximum of 8"},
    {"{'descr': '>i8', 'fortran_order': False, 'shape': (2, 3)}\n",
     "big-endian data is not supported (dtype '>i8')"},
    {"{'descr': '|f4', 'fortran_order': False, 'shape': (2, 3)}\n", "unsupported dtype '|f4'"},
    {"{'descr': '<U4', 'fortran_order': False, 'shape': (2, 3)}\n", "unsupported dtype '<U4'"},
    {"{'descr': '|O', 'fortran_order': False, 'shape': (2, 3)}\n", "unsupported dtype '|O'"},
    {"{'descr': '<f4\x01', 'fortran_order': False, 'shape': (2, 3)}\n", "unsupported dtype '<f4?'"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 0, 3)}\n",
     "trailing data: expected 0 bytes, found 24"}, /* an empty array has no data */
};

TEST(npy_reject_headers) {
    for (size_t i = 0; i < sizeof bad_headers / sizeof bad_headers[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "hdr%zu.npy", i);
        REJECT(make_npy(name, 1, bad_headers[i].header, zeros, 24), KILN_ERR_INPUT,
               bad_headers[i].phrase);
    }
}

TEST(npy_reject_data_size) {
    REJECT(make_npy("short.npy", 1, hdr_f4_2x3, zeros, 20), KILN_ERR_INPUT,
           "truncated data: expected 24 bytes, found 20");
    REJECT(make_npy("long.npy", 1, hdr_f4_2x3, zeros, 28), KILN_ERR_INPUT,
           "trailing data: expected 24 bytes, found 28");
    REJECT(make_npy("nodata.npy", 1, hdr_f4_2x3, zeros, 0), KILN_ERR_INPUT,
           "truncated data: expected 24 bytes, found 0");
}

TEST(npy_reject_bool_byte) {
    unsigned char b[4] = {0, 1, 2, 1};
    REJECT(make_npy("bool2.npy", 1, "{'descr': '|b1', 'fortran_order': False, 'shape': (4,), }\n",
                    b, 4),
           KILN_ERR_INPUT, "bool element 2 holds byte 2; bool bytes must be 0 or 1");
}

TEST(npy_reject_paths) {
    REJECT(tmp("no-such-file.npy"), KILN_ERR_INPUT, "cannot open: No such file or directory");
    REJECT(test_tmpdir(), KILN_ERR_INPUT, "cannot read: Is a directory");
}

TEST(npy_read_unreadable) {
    if (geteuid() == 0) {
        printf("note: npy_read_unreadable skipped (root can read anything)\n");
        return;
    }
    const char *p = make_npy("secret.npy", 1, hdr_f4_2x3, zeros, 24);
    chmod(p, 0);
    REJECT(p, KILN_ERR_ENV, "cannot open: Permission denied");
}

/* ---- spellings of the header that must be accepted -------------------- */

static const char *const good_headers[] = {
    "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2, 3)}\n",
    "{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}",
    "  {\t'descr' :'<f4' ,\n'fortran_order':False,'shape':(2,3,),}   \n\n",
    "{'descr': '=f4', 'fortran_order': False, 'shape': (2L, 3L), }\n",
    "{'descr': 'f4', 'fortran_order': False, 'shape': ( 2 , 3 ) }\n",
    "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
    "        \n",
    "{u'descr': u'<f4', r'fortran_order': False, U\"shape\": (2, 3)}\f\n",
    "{'descr': '<f4', # float32\n 'fortran_order': False, 'shape': (2, 3)} # '}\n",
};

TEST(npy_accept_spellings) {
    for (size_t i = 0; i < sizeof good_headers / sizeof good_headers[0]; i++) {
        char name[32];
        kiln_tensor t;
        snprintf(name, sizeof name, "good%zu.npy", i);
        const char *p = make_npy(name, 1 + (int)i % 3, good_headers[i], f32_2x3, 24);
        if (!READ_OK(p, &t, KILN_F32, 2, 2, 3)) continue;
        EXPECT(memcmp(t.data, f32_2x3, 24) == 0, "%s: values differ", name);
        kiln_tensor_free(&t);
    }
}

TEST(npy_accept_byte_orders) {
    static const char *const descrs[] = {"|b1", "<b1", "=b1", ">b1"};
    for (int i = 0; i < 4; i++) {
        char h[128];
        kiln_tensor t;
        snprintf(h, sizeof h, "{'descr': '%s', 'fortran_order': False, 'shape': (4,)}\n",
                 descrs[i]);
        const unsigned char b[4] = {1, 0, 0, 1};
        if (!READ_OK(make_npy("bo.npy", 1, h, b, 4), &t, KILN_BOOL, 1, 4)) continue;
        EXPECT(memcmp(t.data, b, 4) == 0, "%s: values differ", descrs[i]);
        kiln_tensor_free(&t);
    }
}

TEST(npy_accept_trivial_fortran) {
    /* With at most one dim above 1, Fortran order is the same bytes. */
    kiln_tensor t;
    const char *p = make_npy(
        "f13.npy", 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (1, 6, 1)}\n", f32_2x3, 24);
    if (!READ_OK(p, &t, KILN_F32, 3, 1, 6, 1)) return;
    EXPECT(memcmp(t.data, f32_2x3, 24) == 0, "values differ");
    kiln_tensor_free(&t);
}

/* ---- a pipe: no file size known in advance -------------------------- */

/* Feed bytes through a FIFO from a child process and read the other end. */
static kiln_status read_fifo(const char *bytes, size_t n, kiln_tensor *t, char *err, size_t len) {
    const char *p = tmp("fifo.npy");
    unlink(p);
    if (mkfifo(p, 0600) != 0) {
        snprintf(err, len, "mkfifo: %s", strerror(errno));
        return KILN_ERR_ENV;
    }
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = fopen(p, "wb");
        size_t w = f ? fwrite(bytes, 1, n, f) : 0;
        _exit(f && w == n && fclose(f) == 0 ? 0 : 1);
    }
    kiln_status st = kiln_npy_read(p, t, err, len);
    waitpid(pid, NULL, 0);
    unlink(p);
    return st;
}

TEST(npy_read_pipe) {
    char file[200], err[512] = "";
    size_t h = strlen(hdr_f4_2x3);
    memcpy(file, "\x93NUMPY\x01\x00", 8);
    file[8] = (char)h;
    file[9] = 0;
    memcpy(file + 10, hdr_f4_2x3, h);
    memcpy(file + 10 + h, f32_2x3, 24);
    memset(file + 10 + h + 24, 0, 4);
    kiln_tensor t;
    kiln_status st = read_fifo(file, 10 + h + 24, &t, err, sizeof err);
    CHECKF(st == KILN_OK, "%s", err);
    EXPECT(t.rank == 2 && memcmp(t.data, f32_2x3, 24) == 0, "values differ");
    kiln_tensor_free(&t);
    st = read_fifo(file, 10 + h + 20, &t, err, sizeof err);
    EXPECT(st == KILN_ERR_INPUT && strstr(err, "truncated data: expected 24 bytes, found 20"),
           "%d %s", st, err);
    EXPECT(!t.data, "data left allocated");
    st = read_fifo(file, 10 + h + 28, &t, err, sizeof err);
    EXPECT(st == KILN_ERR_INPUT && strstr(err, "trailing data: expected 24 bytes, found more"),
           "%d %s", st, err);
    EXPECT(!t.data, "data left allocated");
}

/* ---- writer failures ------------------------------------------------- */

static kiln_tensor small_f32(void) {
    kiln_tensor t = {KILN_F32, 2, {2, 3}, (void *)f32_2x3};
    return t;
}

TEST(npy_write_missing_dir) {
    kiln_tensor t = small_f32();
    char err[512] = "";
    const char *p = tmp("no-such-dir/x.npy");
    CHECK(kiln_npy_write(p, &t, err, sizeof err) == KILN_ERR_ENV);
    EXPECT(strncmp(err, p, strlen(p)) == 0, "message does not name the path: %s", err);
    EXPECT(strstr(err, "No such file or directory"), "%s", err);
    EXPECT(!exists(p) && !exists(tmp("no-such-dir")), "a file was left");
}

TEST(npy_write_unwritable_dir) {
    if (geteuid() == 0) {
        printf("note: npy_write_unwritable_dir skipped (root can write anywhere)\n");
        return;
    }
    const char *dir = tmp("readonly");
    mkdir(dir, 0555);
    chmod(dir, 0555);
    if (access(dir, W_OK) == 0) {
        printf("note: skipped, %s stays writable\n", dir);
        return;
    }
    kiln_tensor t = small_f32();
    char err[512] = "";
    const char *p = pathf(dir, "x.npy");
    kiln_status st = kiln_npy_write(p, &t, err, sizeof err);
    EXPECT(st == KILN_ERR_ENV, "status %d: %s", st, err);
    EXPECT(strstr(err, p) && strstr(err, "Permission denied"), "%s", err);
    EXPECT(!exists(p) && count_temporaries(dir) == 0, "a file was left");
    chmod(dir, 0755);
}

TEST(npy_write_over_directory) {
    /* rename() cannot replace a directory: the temporary must go away. */
    const char *dir = tmp("is-a-dir.npy");
    mkdir(dir, 0755);
    kiln_tensor t = small_f32();
    char err[512] = "";
    kiln_status st = kiln_npy_write(dir, &t, err, sizeof err);
    EXPECT(st == KILN_ERR_ENV, "status %d: %s", st, err);
    EXPECT(strncmp(err, dir, strlen(dir)) == 0 && strstr(err, "cannot rename"), "%s", err);
    EXPECT(count_temporaries(test_tmpdir()) == 0, "a temporary was left");
    rmdir(dir);
}

TEST(npy_write_replaces) {
    kiln_tensor t = small_f32(), back;
    char err[512] = "";
    const char *p = tmp("replace.npy");
    write_raw(p, "old contents", 12);
    CHECKF(kiln_npy_write(p, &t, err, sizeof err) == KILN_OK, "%s", err);
    if (!READ_OK(p, &back, KILN_F32, 2, 2, 3)) return;
    EXPECT(memcmp(back.data, f32_2x3, 24) == 0, "values differ");
    kiln_tensor_free(&back);
    EXPECT(count_temporaries(test_tmpdir()) == 0, "a temporary was left");
}

TEST(npy_write_bad_tensor) {
    unsigned char b[3] = {0, 2, 1};
    kiln_tensor bad[] = {
        {KILN_BOOL, 1, {3}, b},
        {KILN_F32, 2, {2, -1}, (void *)f32_2x3},
        {KILN_F32, KILN_MAX_RANK + 1, {1}, (void *)f32_2x3},
        {KILN_F32, 1, {6}, NULL},
    };
    const char *phrase[] = {"bool element 1 holds 2", "dim 1 is -1, negative", "invalid rank 9",
                            "no data"};
    for (int i = 0; i < 4; i++) {
        char err[512] = "";
        const char *p = tmp("bad.npy");
        kiln_status st = kiln_npy_write(p, &bad[i], err, sizeof err);
        EXPECT(st == KILN_ERR_INPUT && strstr(err, phrase[i]), "case %d: %d %s", i, st, err);
        EXPECT(!exists(p), "case %d left a file", i);
    }
}

/* ---- allocation failure ------------------------------------------- */

static int allocs_left;

static void *failing_alloc(void *ud, void *ptr, size_t old, size_t n) {
    (void)ud;
    (void)old;
    if (n == 0) {
        free(ptr);
        return NULL;
    }
    if (allocs_left-- <= 0) return NULL;
    return realloc(ptr, n);
}

TEST(npy_nomem) {
    /* Fail the first, second, ... allocation until the read succeeds; every
     * failure is KILN_ERR_NOMEM and leaks nothing (ASan checks). */
    kiln_status st = KILN_ERR_NOMEM;
    for (int k = 0; k < 10 && st == KILN_ERR_NOMEM; k++) {
        kiln_tensor t;
        char err[512] = "";
        allocs_left = k;
        kiln_set_allocator(failing_alloc, NULL);
        st = kiln_npy_read(fixture("f32_2x3.npy"), &t, err, sizeof err);
        kiln_set_allocator(NULL, NULL);
        EXPECT(st == KILN_OK || (st == KILN_ERR_NOMEM && !t.data && strstr(err, "out of memory")),
               "k=%d: %d %s", k, st, err);
        if (st == KILN_OK) kiln_tensor_free(&t);
    }
    EXPECT(st == KILN_OK, "never succeeded");
    kiln_tensor t = small_f32();
    char err[512] = "";
    allocs_left = 0;
    kiln_set_allocator(failing_alloc, NULL);
    st = kiln_npy_write(tmp("nomem.npy"), &t, err, sizeof err);
    kiln_set_allocator(NULL, NULL);
    EXPECT(st == KILN_ERR_NOMEM && !exists(tmp("nomem.npy")), "write: %d %s", st, err);
}
