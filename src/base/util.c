/*
 * util.c -- the small things every module needs: the one allocation hook,
 * arenas, error formatting, tensors, and the counter-based random
 * generator.
 *
 * Allocation: every byte kiln allocates goes through `hook` (Lua-style
 * alloc(ud, ptr, old, new)), so an embedder can account for memory and a test
 * can make the n-th allocation fail. kmalloc keeps the block size in a small
 * header so kfree needs no size from its caller.
 *
 * Randomness: Philox-4x32-10 (Salmon et al., "Parallel random numbers: as
 * easy as 1, 2, 3", SC'11) maps (seed, counter) to four random words with no
 * state, so element i of a random tensor is a function of the seed and i
 * alone: results never depend on evaluation order or thread count, and the
 * interpreter and generated kernels agree bit for bit.
 */
#include "base/base.h"
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <time.h>
#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

/* ---- allocation ------------------------------------------------------ */

/* The default allocator's budget. Linux commits memory lazily: malloc of a
 * tensor larger than the machine usually succeeds, and the process is then
 * killed (SIGKILL, no message) by the OOM killer when the pages are first
 * written. So the default allocator keeps count of the bytes it holds and
 * refuses to go past what the machine can back: physical memory plus swap,
 * or the cgroup's memory limit when lower, or $KILN_MEM_LIMIT (bytes, with
 * an optional K, M, G or T suffix, powers of 1024) when set. A refusal is an ordinary
 * allocation failure, reported as out of memory with the size asked for.
 * It cannot see other processes' memory; it turns "too large for this
 * machine" into a clean error, not every shortage. A custom hook does its
 * own accounting. */
static int64_t mem_budget; /* 0: not computed yet */
static int64_t mem_held;   /* bytes the default allocator holds (may dip
                              * below 0 if a block moves between hooks) */

/* "512M" -> bytes; -1 when malformed. */
static int64_t parse_bytes(const char *s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    const char *units = "KMGT";
    const char *u = *end ? strchr(units, toupper((unsigned char)*end)) : NULL;
    if (errno || end == s || v <= 0 || (*end && (!u || end[1]))) return -1;
    for (const char *k = units; u && k <= u; k++) v *= 1024;
    return v >= 9.2e18 ? INT64_MAX : (int64_t)v;
}

/* A number from the first line of a file (cgroup limits); -1 if none. */
static int64_t read_limit_file(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[64] = "";
    bool ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    char *end;
    long long v = ok ? strtoll(line, &end, 10) : -1;
    return ok && end != line && v > 0 ? (int64_t)v : -1;
}

static int64_t machine_budget(void) {
    const char *env = getenv("KILN_MEM_LIMIT");
    int64_t v = env && *env ? parse_bytes(env) : -1;
    if (v > 0) return v;
    struct sysinfo si;
    int64_t b = INT64_MAX;
    if (sysinfo(&si) == 0 && si.totalram)
        b = (int64_t)((double)(si.totalram + (double)si.totalswap) * si.mem_unit);
    static const char *const cgroup[] = {"/sys/fs/cgroup/memory.max",
                                         "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
    for (int i = 0; i < 2; i++)
        if ((v = read_limit_file(cgroup[i])) > 0 && v < b) b = v;
    return b;
}

int64_t util_mem_budget(void) {
    int64_t b = __atomic_load_n(&mem_budget, __ATOMIC_RELAXED);
    if (!b) {
        b = machine_budget();
        __atomic_store_n(&mem_budget, b, __ATOMIC_RELAXED);
    }
    return b;
}

static void held_add(int64_t d) { __atomic_add_fetch(&mem_held, d, __ATOMIC_RELAXED); }

static void *default_alloc(void *ud, void *ptr, size_t old, size_t n) {
    (void)ud;
    if (n == 0) {
        free(ptr);
        held_add(-(int64_t)old);
        return NULL;
    }
    if (n > (size_t)INT64_MAX) return NULL;
    int64_t grow = (int64_t)n - (int64_t)old;
    if (grow > 0 && __atomic_add_fetch(&mem_held, grow, __ATOMIC_RELAXED) > util_mem_budget()) {
        held_add(-grow);
        return NULL;
    }
    void *p = realloc(ptr, n);
    if (!p && grow > 0) held_add(-grow);
    if (p && grow < 0) held_add(grow);
    return p;
}

static kiln_alloc_fn hook = default_alloc;
static void *hook_ud;

void kiln_set_allocator(kiln_alloc_fn fn, void *ud) {
    hook = fn ? fn : default_alloc;
    hook_ud = fn ? ud : NULL;
}

/* The header keeps the user size; 16 bytes keep the block 16-aligned. */
#define HDR 16

void *krealloc(void *p, size_t n) {
    if (n > SIZE_MAX - HDR) return NULL;
    char *base = p ? (char *)p - HDR : NULL;
    size_t old = p ? *(size_t *)base + HDR : 0;
    char *nb = hook(hook_ud, base, old, n + HDR);
    if (!nb) return NULL;
    *(size_t *)nb = n;
    return nb + HDR;
}

void *kmalloc(size_t n) { return krealloc(NULL, n); }

void *kcalloc(size_t n, size_t size) {
    if (size && n > SIZE_MAX / size) return NULL;
    void *p = kmalloc(n * size);
    if (p) memset(p, 0, n * size);
    return p;
}

void kfree(void *p) {
    if (!p) return;
    char *base = (char *)p - HDR;
    hook(hook_ud, base, *(size_t *)base + HDR, 0);
}

char *kstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = kmalloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* ---- arenas ----------------------------------------------------------- */

struct ArenaChunk {
    ArenaChunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

void *arena_alloc(Arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    ArenaChunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 16384 ? n : 16384;
        c = kmalloc(sizeof(ArenaChunk) + cap);
        if (!c) return NULL;
        c->used = 0;
        c->cap = cap;
        c->next = a->head;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

void *arena_alloc_lines(Arena *a, size_t n) {
    if (n > SIZE_MAX - KILN_ALIGN) return NULL;
    void *p = arena_alloc(a, n + KILN_ALIGN - 1);
    return p ? util_on_line(p) : NULL;
}

char *arena_strdup(Arena *a, const char *s) {
    size_t n = strlen(s) + 1;
    char *d = arena_alloc(a, n);
    if (d) memcpy(d, s, n);
    return d;
}

void arena_free(Arena *a) {
    for (ArenaChunk *c = a->head, *next; c; c = next) {
        next = c->next;
        kfree(c);
    }
    a->head = NULL;
}

void util_vappend(char *buf, size_t len, const char *fmt, va_list ap) {
    size_t n = strnlen(buf, len);
    if (n + 1 < len) vsnprintf(buf + n, len - n, fmt, ap);
}

void util_fmt(char *buf, size_t len, const char *fmt, ...) {
    if (!len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
}

int64_t util_numel(int rank, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < rank; i++) {
        if (shape[i] < 0) return -1;
        if (shape[i] && n > INT64_MAX / shape[i]) return -1;
        n *= shape[i];
    }
    return n;
}

/* ---- tensors ----------------------------------------------------------- */

size_t kiln_dtype_size(kiln_dtype dt) {
    switch (dt) {
    case KILN_F32:
    case KILN_I32:
    case KILN_U32: return 4;
    case KILN_F64:
    case KILN_I64:
    case KILN_U64: return 8;
    case KILN_BOOL:
    case KILN_I8:
    case KILN_U8: return 1;
    case KILN_I16:
    case KILN_U16:
    case KILN_F16:
    case KILN_BF16: return 2;
    }
    return 0;
}

const char *kiln_dtype_name(kiln_dtype dt) {
    switch (dt) {
    case KILN_F32: return "f32";
    case KILN_F64: return "f64";
    case KILN_I32: return "i32";
    case KILN_I64: return "i64";
    case KILN_BOOL: return "bool";
    case KILN_I8: return "i8";
    case KILN_U8: return "u8";
    case KILN_I16: return "i16";
    case KILN_U16: return "u16";
    case KILN_U32: return "u32";
    case KILN_U64: return "u64";
    case KILN_F16: return "f16";
    case KILN_BF16: return "bf16";
    }
    return "?";
}

int64_t kiln_tensor_numel(const kiln_tensor *t) { return util_numel(t->rank, t->shape); }

/* IEEE half and bfloat16 from and to f32, rounding to nearest even. */
float util_f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023, b;
    float f;
    if (e == 31) {
        b = s | 0x7f800000u | (m << 13); /* inf, NaN */
    } else if (e) {
        b = s | ((e + 112) << 23) | (m << 13);
    } else { /* zero or subnormal: m * 2^-24, exact */
        f = (float)m * 0x1p-24f;
        memcpy(&b, &f, 4);
        b |= s;
    }
    memcpy(&f, &b, 4);
    return f;
}

uint16_t util_f32_to_f16(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    uint16_t s = (uint16_t)((b >> 16) & 0x8000);
    float a = fabsf(f);
    if (a != a) return (uint16_t)(s | 0x7e00 | ((b >> 13) & 0x3ff));
    if (a >= 65520.0f) return (uint16_t)(s | 0x7c00);
    if (a < 0x1p-14f) return (uint16_t)(s | (uint16_t)nearbyintf(a * 0x1p24f)); /* subnormal */
    uint32_t e = ((b >> 23) & 255) - 112, m = b & 0x7fffff;
    uint32_t h = (e << 10) | (m >> 13), rest = m & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++; /* may carry into the exponent */
    return (uint16_t)(s | h);
}

float util_bf16_to_f32(uint16_t h) {
    uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

uint16_t util_f32_to_bf16(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    if ((b & 0x7fffffff) > 0x7f800000u) return (uint16_t)((b >> 16) | 0x40); /* NaN stays NaN */
    return (uint16_t)((b + 0x7fff + ((b >> 16) & 1)) >> 16);
}

/* Ask for transparent huge pages on the whole pages inside [mem, mem +
 * bytes) when that is at least UTIL_HUGE_MIN; only advice, failures
 * ignored. Fewer page faults when fresh memory is first written (512 times
 * fewer for 2 MiB pages), and fewer TLB misses for a kernel streaming
 * through it (docs/decisions.md: Huge pages for large fresh memory). */
#define UTIL_HUGE_MIN ((size_t)4 << 20)
void util_advise_huge(void *mem, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    long page = sysconf(_SC_PAGESIZE);
    if (!mem || bytes < UTIL_HUGE_MIN || page <= 0) return;
    uintptr_t start = ((uintptr_t)mem + (uintptr_t)page - 1) / (uintptr_t)page * (uintptr_t)page;
    uintptr_t end = ((uintptr_t)mem + bytes) / (uintptr_t)page * (uintptr_t)page;
    if (end > start) (void)madvise((void *)start, end - start, MADV_HUGEPAGE);
#else
    (void)mem, (void)bytes;
#endif
}

/* Tensor data starts on a cache line (KILN_ALIGN bytes), as the runtime's
 * arena does: a 512-bit load from a row that starts mid-line touches two
 * lines. glibc hands out large blocks 16 bytes into a page and kmalloc's
 * header adds 16, so without this every row of a 4096-float tensor would
 * begin 32 bytes into a line (docs/decisions.md: Tensor data on cache
 * lines). The byte before the data holds its distance from the kmalloc'd
 * block (1 to KILN_ALIGN). */
static void *kmalloc_lines(size_t n) {
    if (n > SIZE_MAX - KILN_ALIGN) return NULL;
    unsigned char *base = kmalloc(n + KILN_ALIGN);
    if (!base) return NULL;
    size_t off = KILN_ALIGN - (uintptr_t)base % KILN_ALIGN;
    base[off - 1] = (unsigned char)off;
    return base + off;
}

static void kfree_lines(void *p) {
    if (p) kfree((unsigned char *)p - ((unsigned char *)p)[-1]);
}

kiln_status kiln_tensor_alloc(kiln_tensor *t) {
    int64_t n = kiln_tensor_numel(t);
    size_t es = kiln_dtype_size(t->dtype);
    t->data = NULL;
    if (n < 0 || (uint64_t)n > SIZE_MAX / 2 / (es ? es : 1)) return KILN_ERR_NOMEM;
    size_t bytes = (size_t)n * es;
    t->data = kmalloc_lines(bytes ? bytes : 1);
    util_advise_huge(t->data, bytes);
    return t->data ? KILN_OK : KILN_ERR_NOMEM;
}

void kiln_tensor_free(kiln_tensor *t) {
    if (!t) return;
    kfree_lines(t->data);
    t->data = NULL;
}

/* ---- Philox-4x32-10 ---------------------------------------------------- */

float util_rand_uniform(uint64_t seed, uint64_t i) {
    return kiln_rand(seed, i); /* the generated kernels' kiln_rand, kiln_rt.h */
}

/* Box-Muller on two words of the element's own counter. */
float util_rand_normal(uint64_t seed, uint64_t i) {
    uint32_t w[4];
    kiln_philox4x32(seed, i, w);
    double u1 = ((double)(w[0] >> 8) + 1.0) / 16777217.0; /* (0, 1]: log is finite */
    double u2 = (double)(w[1] >> 8) / 16777216.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void kiln_fill_randn(float *data, int64_t n, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) data[i] = util_rand_normal(seed, (uint64_t)i);
}

void kiln_fill_rand(float *data, int64_t n, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) data[i] = util_rand_uniform(seed, (uint64_t)i);
}

int64_t util_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

double util_now_ms(void) { return (double)util_now_ns() / 1e6; }

bool util_write_file(const char *path, void (*fn)(FILE *, void *), void *ud) {
    char tmp[4200];
    util_fmt(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return false;
    fn(f, ud);
    bool ok = !ferror(f);
    ok &= fclose(f) == 0;
    if (ok && rename(tmp, path) == 0) return true;
    int e = errno;
    remove(tmp);
    errno = e;
    return false;
}
