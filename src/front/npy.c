/*
 * npy.c -- numpy .npy files <-> kiln_tensor.
 *
 * A .npy file is the magic "\x93NUMPY", a format version (major 1, 2 or 3,
 * minor 0), the header length (u16 LE for 1.0, u32 LE for 2.0 and 3.0), a
 * header that is a Python dict literal such as
 *
 *     {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
 *
 * padded with spaces to end in '\n', and then the raw array bytes. Version 3
 * only changes the header's encoding to UTF-8, which matters for structured
 * field names alone, and kiln rejects those anyway.
 *
 * The reader is strict about everything that decides how the bytes are
 * interpreted (dtype, byte order, memory order, shape, the exact data size)
 * and lenient about how the dict is spelled (key order, quotes, whitespace,
 * trailing commas), because the files come from many writers. The checks
 * follow numpy's own _read_array_header: exactly the three keys, shape a
 * tuple of ints, fortran_order a bool. Every failure names the file and says
 * what is wrong; bad files are KILN_ERR_INPUT, failed I/O is KILN_ERR_ENV.
 *
 * The writer produces byte for byte what np.save writes for the same array
 * (version 1.0, keys sorted, data aligned to 64 bytes), so tests can compare
 * against numpy's own files. It writes a temporary file next to the target
 * and renames it into place, so a crash or a full disk never leaves a
 * partial .npy behind.
 */
#include "front/front.h"
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* .npy data is little-endian and kiln copies it without swapping. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "npy.c assumes a little-endian host"
#endif

#define MAGIC "\x93NUMPY"
#define MAGIC_LEN 6
#define ARRAY_ALIGN 64       /* numpy aligns the data to this */
#define MAX_HEADER (1 << 16) /* numpy refuses more than 10000 by default */
#define DESCR_MAX 40         /* longer dtype strings are cut in messages */

/* ---- messages ----------------------------------------------------------- */

/* Format "path: message" into err (which may be NULL) and return st. */
static kiln_status vfail(char *err, size_t errlen, const char *path, kiln_status st,
                         const char *fmt, va_list ap) {
    if (!err || !errlen) return st;
    int n = snprintf(err, errlen, "%s: ", path);
    if (n >= 0 && (size_t)n < errlen) vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
    return st;
}

/* Copy untrusted text into buf for a message: printable ASCII only, cut short. */
static const char *printable(char *buf, size_t len, const char *s, size_t n) {
    size_t j = 0;
    for (size_t i = 0; i < n && j + 4 < len; i++)
        buf[j++] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
    if (n > 0 && j + 4 >= len) {
        memcpy(buf + j, "...", 3);
        j += 3;
    }
    buf[j] = '\0';
    return buf;
}

/* A shape as numpy prints it: (), (5,), (2, 3). */
static const char *fmt_shape(char *buf, size_t len, int rank, const int64_t *shape) {
    size_t j = (size_t)snprintf(buf, len, "(");
    for (int i = 0; i < rank && j < len; i++)
        j += (size_t)snprintf(buf + j, len - j, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (j < len) snprintf(buf + j, len - j, rank == 1 ? ",)" : ")");
    return buf;
}

/* ---- reading: the state -------------------------------------------------- */

typedef struct {
    const char *path; /* named in every message */
    FILE *f;
    char *err;
    size_t errlen;
    kiln_status st; /* set by rfail */
} Reader;

__attribute__((format(printf, 3, 4))) static bool rfail(Reader *r, kiln_status st, const char *fmt,
                                                        ...) {
    va_list ap;
    va_start(ap, fmt);
    r->st = vfail(r->err, r->errlen, r->path, st, fmt, ap);
    va_end(ap);
    return false;
}

/* Read exactly n bytes; *got receives how many arrived. A read error fails
 * here (KILN_ERR_ENV); a short read at end of file is left to the caller. */
static bool read_bytes(Reader *r, void *buf, size_t n, size_t *got) {
    *got = n ? fread(buf, 1, n, r->f) : 0;
    if (*got < n && ferror(r->f)) return rfail(r, KILN_ERR_ENV, "read error: %s", strerror(errno));
    return true;
}

/* ---- reading: the header dict ------------------------------------------ */

/* What the header says, before it is checked against what kiln supports. */
typedef struct {
    char descr[DESCR_MAX]; /* the dtype string, printable, cut to fit */
    bool structured;       /* descr was a list of fields */
    bool fortran;
    int rank; /* dims in the tuple; may exceed KILN_MAX_RANK */
    int64_t shape[KILN_MAX_RANK];
    bool seen_descr, seen_fortran, seen_shape;
} Header;

/* A cursor over the header text. */
typedef struct {
    Reader *r;
    const char *s, *begin, *end;
} Lex;

__attribute__((format(printf, 2, 3))) static bool malformed(Lex *lx, const char *fmt, ...) {
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return rfail(lx->r, KILN_ERR_INPUT, "malformed header: %s (at header byte %td)", what,
                 lx->s - lx->begin);
}

static bool one_of(char c, const char *set) { return c && strchr(set, c); }

/* Python's whitespace and comments between tokens. */
static void skip_ws(Lex *lx) {
    for (; lx->s < lx->end; lx->s++) {
        if (*lx->s == '#')
            while (lx->s + 1 < lx->end && lx->s[1] != '\n') lx->s++;
        else if (!one_of(*lx->s, " \t\r\n\f"))
            break;
    }
}

static bool peek(Lex *lx, char c) {
    skip_ws(lx);
    return lx->s < lx->end && *lx->s == c;
}

static bool accept(Lex *lx, char c) {
    if (!peek(lx, c)) return false;
    lx->s++;
    return true;
}

static bool is_ident(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* A Python word such as True, matched as a whole word. */
static bool accept_word(Lex *lx, const char *w) {
    size_t n = strlen(w);
    skip_ws(lx);
    if ((size_t)(lx->end - lx->s) < n || memcmp(lx->s, w, n) != 0) return false;
    if (lx->s + n < lx->end && is_ident(lx->s[n])) return false;
    lx->s += n;
    return true;
}

/* A quoted string ('...' or "...", with an optional u or r prefix); *str
 * and *len point into the header. Escapes are skipped over, not decoded:
 * kiln only compares plain names. */
static bool lex_string(Lex *lx, const char **str, size_t *len) {
    skip_ws(lx);
    if (lx->end - lx->s >= 2 && one_of(lx->s[0], "uUrR") && one_of(lx->s[1], "'\"")) lx->s++;
    if (lx->s >= lx->end || (*lx->s != '\'' && *lx->s != '"'))
        return malformed(lx, "expected a quoted string");
    char q = *lx->s++;
    const char *start = lx->s;
    while (lx->s < lx->end && *lx->s != q && *lx->s != '\n')
        lx->s += (*lx->s == '\\' && lx->s + 1 < lx->end) ? 2 : 1;
    if (lx->s >= lx->end || *lx->s != q) return malformed(lx, "unterminated string");
    *str = start;
    *len = (size_t)(lx->s - start);
    lx->s++;
    return true;
}

/* Skip a bracketed literal (a structured dtype's field list), strings and
 * all, without interpreting it. */
static bool skip_nested(Lex *lx) {
    int depth = 0;
    do {
        if (lx->s >= lx->end) return malformed(lx, "unterminated list in 'descr'");
        char c = *lx->s;
        if (c == '\'' || c == '"') {
            const char *str;
            size_t len;
            if (!lex_string(lx, &str, &len)) return false;
            continue;
        }
        depth += (c == '(' || c == '[' || c == '{') - (c == ')' || c == ']' || c == '}');
        lx->s++;
    } while (depth > 0);
    return true;
}

static bool parse_descr(Lex *lx, Header *h) {
    if (peek(lx, '[')) {
        h->structured = true;
        return skip_nested(lx);
    }
    const char *s;
    size_t n;
    skip_ws(lx);
    if (lx->s >= lx->end || !one_of(*lx->s, "'\"uUrR"))
        return malformed(lx, "'descr' must be a dtype string such as '<f4'");
    if (!lex_string(lx, &s, &n)) return false;
    printable(h->descr, sizeof h->descr, s, n);
    return true;
}

static bool parse_fortran(Lex *lx, Header *h) {
    if (accept_word(lx, "True"))
        h->fortran = true;
    else if (accept_word(lx, "False"))
        h->fortran = false;
    else
        return malformed(lx, "'fortran_order' must be True or False");
    return true;
}

/* One dimension: a Python int literal (an old Python 2 'L' suffix is
 * allowed, as numpy allows it). */
static bool parse_dim(Lex *lx, int64_t *out) {
    skip_ws(lx);
    bool neg = accept(lx, '-');
    skip_ws(lx);
    if (lx->s >= lx->end || *lx->s < '0' || *lx->s > '9')
        return malformed(lx, "'shape' must be a tuple of integers");
    uint64_t v = 0;
    bool big = false;
    for (; lx->s < lx->end && *lx->s >= '0' && *lx->s <= '9'; lx->s++) {
        big |= v > ((uint64_t)INT64_MAX - 9) / 10;
        v = big ? v : v * 10 + (uint64_t)(*lx->s - '0');
    }
    if (lx->s < lx->end && *lx->s == 'L') lx->s++;
    if (lx->s < lx->end && is_ident(*lx->s))
        return malformed(lx, "'shape' must be a tuple of integers");
    if (neg && v) return malformed(lx, "negative dimension -%" PRIu64 " in 'shape'", v);
    if (big) return malformed(lx, "a dimension in 'shape' is too large");
    *out = (int64_t)v;
    return true;
}

/* A Python tuple of ints: (), (5,), (2, 3), (2, 3,). Note (5) is the int 5,
 * not a tuple, and numpy rejects it too. */
static bool parse_shape(Lex *lx, Header *h) {
    if (!accept(lx, '(')) return malformed(lx, "'shape' must be a tuple of integers");
    h->rank = 0;
    if (accept(lx, ')')) return true;
    for (;;) {
        int64_t d = 0;
        if (!parse_dim(lx, &d)) return false;
        if (h->rank < KILN_MAX_RANK) h->shape[h->rank] = d;
        h->rank++;
        if (accept(lx, ',')) {
            if (accept(lx, ')')) return true;
            continue;
        }
        if (!accept(lx, ')')) return malformed(lx, "expected ',' or ')' in 'shape'");
        if (h->rank == 1)
            return malformed(lx,
                             "'shape' (%" PRId64 ") is not a tuple; "
                             "a 1-D shape is written (%" PRId64 ",)",
                             d, d);
        return true;
    }
}

/* One "key: value" entry of the dict. */
static bool parse_entry(Lex *lx, Header *h) {
    const char *key;
    size_t n;
    if (!lex_string(lx, &key, &n)) return false;
    static const char *const names[] = {"descr", "fortran_order", "shape"};
    bool *seen[] = {&h->seen_descr, &h->seen_fortran, &h->seen_shape};
    int k = 0;
    while (k < 3 && !(strlen(names[k]) == n && memcmp(names[k], key, n) == 0)) k++;
    char kbuf[DESCR_MAX];
    if (k == 3) return malformed(lx, "unexpected key '%s'", printable(kbuf, sizeof kbuf, key, n));
    if (*seen[k]) return malformed(lx, "duplicate key '%s'", names[k]);
    *seen[k] = true;
    if (!accept(lx, ':')) return malformed(lx, "expected ':' after key '%s'", names[k]);
    if (k == 0) return parse_descr(lx, h);
    if (k == 1) return parse_fortran(lx, h);
    return parse_shape(lx, h);
}

/* The whole header: a dict literal, then only whitespace. */
static bool parse_header(Reader *r, const char *text, size_t len, Header *h) {
    Lex lx = {r, text, text, text + len};
    memset(h, 0, sizeof *h);
    if (!accept(&lx, '{')) return malformed(&lx, "expected a dict literal starting with '{'");
    while (!accept(&lx, '}')) {
        if (!parse_entry(&lx, h)) return false;
        if (!accept(&lx, ',') && !peek(&lx, '}'))
            return malformed(&lx, "expected ',' or '}' after a value");
    }
    skip_ws(&lx);
    if (lx.s != lx.end) return malformed(&lx, "unexpected text after the closing '}'");
    const char *missing = !h->seen_descr     ? "descr"
                          : !h->seen_fortran ? "fortran_order"
                          : !h->seen_shape   ? "shape"
                                             : NULL;
    if (missing) return rfail(r, KILN_ERR_INPUT, "malformed header: missing key '%s'", missing);
    return true;
}

/* ---- reading: checking the header against what kiln supports ----------- */

/* The dtype of a descr string: an optional byte-order mark, then one of the
 * five kinds kiln has. '=' is native order (little-endian here) and '|' is
 * "not applicable", which numpy writes for 1-byte types. Returns -1 for a
 * kind kiln lacks; *big_endian reports a '>' (or '!') mark. */
static int descr_dtype(const char *d, bool *big_endian) {
    static const struct {
        const char *code;
        kiln_dtype dt;
    } kinds[] = {
        {"f4", KILN_F32},  {"f8", KILN_F64}, {"i4", KILN_I32}, {"i8", KILN_I64},
        {"b1", KILN_BOOL}, {"i1", KILN_I8},  {"u1", KILN_U8},  {"i2", KILN_I16},
        {"u2", KILN_U16},  {"u4", KILN_U32}, {"u8", KILN_U64}, {"f2", KILN_F16},
    };
    char order = one_of(*d, "<>=|!") ? *d++ : '=';
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        if (strcmp(d, kinds[i].code) != 0) continue;
        bool one_byte = kiln_dtype_size(kinds[i].dt) == 1;
        if (order == '|' && !one_byte) return -1;
        *big_endian = (order == '>' || order == '!') && !one_byte;
        return (int)kinds[i].dt;
    }
    return -1;
}

static bool check_dtype(Reader *r, const Header *h, kiln_dtype *dt) {
    if (h->structured)
        return rfail(r, KILN_ERR_INPUT,
                     "unsupported dtype: structured dtypes "
                     "(records with named fields) are not supported");
    bool big = false;
    int k = descr_dtype(h->descr, &big); /* a cut descr ends in "...": no match */
    if (k < 0)
        return rfail(r, KILN_ERR_INPUT,
                     "unsupported dtype '%s' (kiln reads '<f2', '<f4', '<f8', '|b1' and "
                     "the integers '|i1' to '<u8')",
                     h->descr);
    if (big)
        return rfail(r, KILN_ERR_INPUT,
                     "big-endian data is not supported (dtype '%s'); "
                     "save with arr.astype('<%s')",
                     h->descr, h->descr + 1);
    *dt = (kiln_dtype)k;
    return true;
}

/* C and Fortran order lay out the same bytes when at most one dim exceeds 1,
 * so only the other Fortran-order arrays need a copy kiln does not make. */
static bool check_order(Reader *r, const Header *h) {
    int big_dims = 0;
    for (int i = 0; i < h->rank; i++) big_dims += h->shape[i] > 1;
    if (h->fortran && big_dims > 1)
        return rfail(r, KILN_ERR_INPUT,
                     "Fortran-order arrays are not supported; "
                     "save with np.ascontiguousarray");
    return true;
}

/* Fill out's dtype, rank and shape and the data size from a parsed header. */
static bool check_header(Reader *r, const Header *h, kiln_tensor *out, size_t *nbytes) {
    char sbuf[200];
    if (!check_dtype(r, h, &out->dtype)) return false;
    if (h->rank > KILN_MAX_RANK)
        return rfail(r, KILN_ERR_INPUT, "rank %d is more than kiln's maximum of %d", h->rank,
                     KILN_MAX_RANK);
    if (!check_order(r, h)) return false;
    out->rank = h->rank;
    memcpy(out->shape, h->shape, sizeof h->shape);
    fmt_shape(sbuf, sizeof sbuf, h->rank, h->shape);
    int64_t n = util_numel(h->rank, h->shape); /* 0 for an empty array: no data follows */
    size_t es = kiln_dtype_size(out->dtype);
    if (n < 0 || (uint64_t)n > (uint64_t)INT64_MAX / es || (uint64_t)n > SIZE_MAX / es)
        return rfail(r, KILN_ERR_INPUT, "shape %s is too large", sbuf);
    *nbytes = (size_t)n * es;
    return true;
}

/* ---- reading: the file ----------------------------------------------- */

static uint32_t load_le(const unsigned char *p, int n) {
    uint32_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* Magic, version and header length; *hlen receives the latter. */
static bool read_preamble(Reader *r, uint32_t *hlen, long *pos) {
    unsigned char b[12];
    size_t got;
    if (!read_bytes(r, b, 8, &got)) return false;
    if (got < MAGIC_LEN || memcmp(b, MAGIC, MAGIC_LEN) != 0)
        return rfail(r, KILN_ERR_INPUT, "not a .npy file (it does not start with \\x93NUMPY)");
    if (got < 8)
        return rfail(r, KILN_ERR_INPUT, "truncated header: the file ends inside the version");
    if (b[6] < 1 || b[6] > 3 || b[7] != 0)
        return rfail(r, KILN_ERR_INPUT,
                     "unsupported .npy format version %d.%d "
                     "(kiln reads 1.0, 2.0 and 3.0)",
                     b[6], b[7]);
    int lenbytes = b[6] == 1 ? 2 : 4;
    if (!read_bytes(r, b + 8, (size_t)lenbytes, &got)) return false;
    if (got < (size_t)lenbytes)
        return rfail(r, KILN_ERR_INPUT, "truncated header: the file ends inside the header length");
    *hlen = load_le(b + 8, lenbytes);
    *pos = 8 + lenbytes;
    return true;
}

static bool read_header(Reader *r, Header *h, long *pos) {
    uint32_t hlen = 0;
    if (!read_preamble(r, &hlen, pos)) return false;
    if (hlen > MAX_HEADER)
        return rfail(r, KILN_ERR_INPUT,
                     "header of %" PRIu32 " bytes is too large "
                     "(kiln reads at most %d)",
                     hlen, MAX_HEADER);
    char *text = kmalloc(hlen ? hlen : 1);
    if (!text) return rfail(r, KILN_ERR_NOMEM, "out of memory reading the header");
    size_t got;
    bool ok = read_bytes(r, text, hlen, &got);
    if (ok && got < hlen)
        ok = rfail(r, KILN_ERR_INPUT, "truncated header: expected %" PRIu32 " bytes, found %zu",
                   hlen, got);
    ok = ok && parse_header(r, text, hlen, h);
    kfree(text);
    *pos += hlen;
    return ok;
}

/* For a regular file, compare the size left with what the shape needs
 * before allocating, so a corrupt header cannot ask for terabytes. */
static bool check_size(Reader *r, long pos, size_t nbytes) {
    struct stat st;
    if (fstat(fileno(r->f), &st) != 0 || !S_ISREG(st.st_mode)) return true;
    uint64_t left = st.st_size > pos ? (uint64_t)(st.st_size - pos) : 0;
    if (left < nbytes)
        return rfail(r, KILN_ERR_INPUT, "truncated data: expected %zu bytes, found %" PRIu64,
                     nbytes, left);
    if (left > nbytes)
        return rfail(r, KILN_ERR_INPUT, "trailing data: expected %zu bytes, found %" PRIu64, nbytes,
                     left);
    return true;
}

static bool check_bools(Reader *r, const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] > 1)
            return rfail(r, KILN_ERR_INPUT,
                         "bool element %zu holds byte %d; "
                         "bool bytes must be 0 or 1",
                         i, p[i]);
    return true;
}

/* The array bytes, then end of file. */
static bool read_data(Reader *r, kiln_tensor *out, size_t nbytes) {
    if (kiln_tensor_alloc(out) != KILN_OK)
        return rfail(r, KILN_ERR_NOMEM, "out of memory for %zu bytes of data", nbytes);
    size_t got;
    if (!read_bytes(r, out->data, nbytes, &got)) return false;
    if (got < nbytes)
        return rfail(r, KILN_ERR_INPUT, "truncated data: expected %zu bytes, found %zu", nbytes,
                     got);
    if (fgetc(r->f) != EOF)
        return rfail(r, KILN_ERR_INPUT, "trailing data: expected %zu bytes, found more", nbytes);
    if (ferror(r->f)) return rfail(r, KILN_ERR_ENV, "read error: %s", strerror(errno));
    if (out->dtype == KILN_BOOL) return check_bools(r, out->data, nbytes);
    return true;
}

/* A path that names no file is the caller's mistake; anything else
 * (permissions, descriptors, I/O) is the environment's. */
static kiln_status open_status(int e) {
    return (e == ENOENT || e == ENOTDIR || e == ENAMETOOLONG || e == ELOOP) ? KILN_ERR_INPUT
                                                                            : KILN_ERR_ENV;
}

static bool open_reader(Reader *r) {
    r->f = fopen(r->path, "rb");
    if (!r->f) {
        int e = errno;
        return rfail(r, open_status(e), "cannot open: %s", strerror(e));
    }
    struct stat st;
    if (fstat(fileno(r->f), &st) == 0 && S_ISDIR(st.st_mode))
        return rfail(r, KILN_ERR_INPUT, "cannot read: %s", strerror(EISDIR));
    return true;
}

kiln_status kiln_npy_read(const char *path, kiln_tensor *out, char *err, size_t errlen) {
    Reader r = {path, NULL, err, errlen, KILN_OK};
    Header h;
    long pos = 0;
    size_t nbytes = 0;
    memset(out, 0, sizeof *out);
    if (err && errlen) err[0] = '\0';
    bool ok = open_reader(&r) && read_header(&r, &h, &pos) && check_header(&r, &h, out, &nbytes) &&
              check_size(&r, pos, nbytes) && read_data(&r, out, nbytes);
    if (r.f) fclose(r.f);
    if (!ok) kiln_tensor_free(out);
    return ok ? KILN_OK : r.st;
}

/* ---- writing ------------------------------------------------------------- */

typedef struct {
    const char *path; /* the target, named in every message */
    char *tmp;        /* path + ".tmp.<pid>" */
    char *err;
    size_t errlen;
} Writer;

__attribute__((format(printf, 3, 4))) static kiln_status wfail(Writer *w, kiln_status st,
                                                               const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(w->err, w->errlen, w->path, st, fmt, ap);
    va_end(ap);
    return st;
}

static const char *const descr_of[] = {
    [KILN_F32] = "<f4",  [KILN_F64] = "<f8", [KILN_I32] = "<i4", [KILN_I64] = "<i8",
    [KILN_BOOL] = "|b1", [KILN_I8] = "|i1",  [KILN_U8] = "|u1",  [KILN_I16] = "<i2",
    [KILN_U16] = "<u2",  [KILN_U32] = "<u4", [KILN_U64] = "<u8", [KILN_F16] = "<f2",
};

/* Reject a tensor that would make a file kiln itself could not read. */
static kiln_status check_tensor(Writer *w, const kiln_tensor *t, size_t *nbytes) {
    if ((unsigned)t->dtype > KILN_F16)
        return wfail(w, KILN_ERR_INPUT,
                     t->dtype == KILN_BF16 ? "cannot write: numpy has no bfloat16 (convert to f32)"
                                           : "cannot write: invalid dtype %d",
                     (int)t->dtype);
    if (t->rank < 0 || t->rank > KILN_MAX_RANK)
        return wfail(w, KILN_ERR_INPUT, "cannot write: invalid rank %d", t->rank);
    int64_t n = kiln_tensor_numel(t);
    size_t es = kiln_dtype_size(t->dtype);
    for (int i = 0; i < t->rank; i++)
        if (t->shape[i] < 0)
            return wfail(w, KILN_ERR_INPUT, "cannot write: dim %d is %" PRId64 ", negative", i,
                         t->shape[i]);
    if (n < 0 || (uint64_t)n > SIZE_MAX / es)
        return wfail(w, KILN_ERR_INPUT, "cannot write: the shape is too large");
    if (!t->data && n > 0) return wfail(w, KILN_ERR_INPUT, "cannot write: the tensor has no data");
    const unsigned char *b = t->data;
    for (int64_t i = 0; t->dtype == KILN_BOOL && i < n; i++)
        if (b[i] > 1)
            return wfail(w, KILN_ERR_INPUT,
                         "cannot write: bool element %" PRId64 " holds %d, not 0 or 1", i, b[i]);
    *nbytes = (size_t)n * es;
    return KILN_OK;
}

/* The preamble and header np.save writes for t; returns the length. buf
 * holds at least 512 bytes (a rank-6 header needs under 256). np.save also
 * adds up to 20 spaces so axis 0 can grow in place; they never move the
 * data offset for any shape whose numel fits in int64 (checked against
 * numpy over 200k shapes), so the padding below gives the same bytes. */
static size_t build_header(char *buf, const kiln_tensor *t) {
    char shape[200];
    fmt_shape(shape, sizeof shape, t->rank, t->shape);
    memcpy(buf, MAGIC "\x01\x00", 8);
    int n = snprintf(buf + 10, 400, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                     descr_of[t->dtype], shape);
    size_t len = (size_t)n;
    size_t pad = ARRAY_ALIGN - (10 + len + 1) % ARRAY_ALIGN;
    memset(buf + 10 + len, ' ', pad);
    len += pad;
    buf[10 + len++] = '\n';
    buf[8] = (char)(len & 0xff);
    buf[9] = (char)(len >> 8);
    return 10 + len;
}

/* Write header and data to w->tmp and make them durable. A stale temporary
 * (a crashed writer with our pid) is removed first; "x" then creates the
 * file afresh and never follows a link planted under that name. */
static kiln_status write_tmp(Writer *w, const char *hdr, size_t hlen, const void *data,
                             size_t nbytes) {
    remove(w->tmp);
    FILE *f = fopen(w->tmp, "wbx");
    if (!f) return wfail(w, KILN_ERR_ENV, "cannot create %s: %s", w->tmp, strerror(errno));
    bool ok = fwrite(hdr, 1, hlen, f) == hlen &&
              (!nbytes || fwrite(data, 1, nbytes, f) == nbytes) && fflush(f) == 0 &&
              fsync(fileno(f)) == 0;
    int e = errno;
    if (fclose(f) != 0 && ok) {
        ok = false;
        e = errno;
    }
    if (!ok) return wfail(w, KILN_ERR_ENV, "write error on %s: %s", w->tmp, strerror(e));
    return KILN_OK;
}

kiln_status kiln_npy_write(const char *path, const kiln_tensor *t, char *err, size_t errlen) {
    Writer w = {path, NULL, err, errlen};
    size_t nbytes = 0;
    if (err && errlen) err[0] = '\0';
    kiln_status st = check_tensor(&w, t, &nbytes);
    if (st != KILN_OK) return st;
    char hdr[512];
    size_t hlen = build_header(hdr, t);
    size_t tlen = strlen(path) + 32;
    if (!(w.tmp = kmalloc(tlen))) return wfail(&w, KILN_ERR_NOMEM, "out of memory");
    snprintf(w.tmp, tlen, "%s.tmp.%ld", path, (long)getpid());
    st = write_tmp(&w, hdr, hlen, t->data, nbytes);
    if (st == KILN_OK && rename(w.tmp, path) != 0)
        st = wfail(&w, KILN_ERR_ENV, "cannot rename %s into place: %s", w.tmp, strerror(errno));
    if (st != KILN_OK) remove(w.tmp);
    kfree(w.tmp);
    return st;
}
