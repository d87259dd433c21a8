/*
 * jit.c -- generated C -> cached shared object -> dlopen.
 *
 * The code generator hands us one C source per program. Compiling it costs
 * a second or more, so results live in a cache directory keyed by a hash
 * (SHA-256, first 128 bits) of everything that decides the binary: the
 * source, the full flag string, the compiler command, the first line of
 * `$CC --version` and the CPU's feature flags (the target tier's flags,
 * among the extra flags, say which instructions the object uses, and its
 * -mtune=native makes the object CPU-specific; a shared home directory
 * must not hand an AVX-512 object to another machine). The version and CPU lines are computed once
 * per process (and per $CC) and memoized; the version line is also kept in
 * the cache directory for the next process (version_file).
 *
 * Files: <dir>/<key>.c and <dir>/<key>.so (and compiler-<hash>.version).
 * Each only ever appears by rename() of a file with a name unique to this
 * process and call, so readers never see partial files, and two processes
 * compiling the same key both succeed: the last rename wins, with
 * identical content. The source gets a marker symbol kiln_jit_marker_<key>
 * (holding the key) appended; a cached .so counts as a hit only if it is a
 * whole ELF file (every table its header names lies inside the file:
 * dlopen would map a truncated one and fault on first touch),
 * dlopen(RTLD_NOW | RTLD_LOCAL) accepts it and the marker resolves to the
 * key. Anything else is a broken entry: deleted and rebuilt once.
 *
 * The compiler runs through posix_spawnp with an argv (never a shell), its
 * stdout and stderr captured through a pipe; the first 4 KB go into the
 * error message, together with the path of the kept source. A program
 * with JIT_SPLIT_MIN bytes of kernels or more compiles as two translation
 * units at once, then links (compile_split); the key, the kept source and
 * the cached .so are the whole program's as for one unit.
 */
#include "runtime/runtime.h"
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define JIT_FLAGS "-O3 -fopenmp -fno-math-errno -shared -fPIC -std=c11"
#define JIT_PATH_MAX 512
#define JIT_OUT_MAX 4096 /* compiler output kept for a message */
#define JIT_KEY_HEX 32   /* 128 bits of SHA-256 */

struct JitLib {
    void *handle; /* from dlopen */
};

/* ===== SHA-256 (FIPS 180-4) ============================================ */

typedef struct {
    uint32_t h[8];
    uint8_t buf[64];
    size_t nbuf;  /* bytes waiting in buf */
    uint64_t len; /* total bytes hashed */
} Sha256;

static const uint32_t sha_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t ror(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void sha_init(Sha256 *s) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof h0);
    s->nbuf = 0;
    s->len = 0;
}

/* The message schedule and 64 rounds over one 64-byte block. */
static void sha_block(uint32_t h[8], const uint8_t *p) {
    uint32_t w[64], v[8];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    memcpy(v, h, sizeof v);
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = v[7] + (ror(v[4], 6) ^ ror(v[4], 11) ^ ror(v[4], 25)) +
                      ((v[4] & v[5]) ^ (~v[4] & v[6])) + sha_k[i] + w[i];
        uint32_t t2 = (ror(v[0], 2) ^ ror(v[0], 13) ^ ror(v[0], 22)) +
                      ((v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]));
        memmove(v + 1, v, 7 * sizeof v[0]);
        v[4] += t1;
        v[0] = t1 + t2;
    }
    for (int i = 0; i < 8; i++) h[i] += v[i];
}

static void sha_update(Sha256 *s, const void *data, size_t n) {
    const uint8_t *p = data;
    s->len += n;
    while (n > 0) {
        size_t k = 64 - s->nbuf < n ? 64 - s->nbuf : n;
        memcpy(s->buf + s->nbuf, p, k);
        s->nbuf += k, p += k, n -= k;
        if (s->nbuf == 64) {
            sha_block(s->h, s->buf);
            s->nbuf = 0;
        }
    }
}

static void sha_final_hex(Sha256 *s, char out[65]) {
    uint64_t bits = s->len * 8;
    uint8_t pad[72] = {0x80};
    size_t npad = (s->nbuf < 56 ? 56 : 120) - s->nbuf;
    for (int i = 0; i < 8; i++) pad[npad + i] = (uint8_t)(bits >> (56 - 8 * i));
    sha_update(s, pad, npad + 8);
    for (int i = 0; i < 8; i++) snprintf(out + 8 * i, 9, "%08x", (unsigned)s->h[i]);
}

static void sha256_hex(const void *data, size_t n, char out[65]) {
    Sha256 s;
    sha_init(&s);
    sha_update(&s, data, n);
    sha_final_hex(&s, out);
}

#ifdef KILN_TESTING
#include "testing.h"
void jit_sha256_hex(const void *data, size_t n, char out[65]) { sha256_hex(data, n, out); }
#endif

/* ===== small helpers ===================================================== */

static kiln_status fail(char *err, size_t errlen, kiln_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static kiln_status fail(char *err, size_t errlen, kiln_status st, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return st;
}

/* snprintf that reports truncation (paths must fit JIT_PATH_MAX). */
static bool fmt_fits(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static bool fmt_fits(char *buf, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, len, fmt, ap);
    va_end(ap);
    return n >= 0 && (size_t)n < len;
}

/* Process-unique temporary names: pid plus a counter. */
static unsigned next_serial(void) {
    static unsigned counter;
    return __atomic_fetch_add(&counter, 1u, __ATOMIC_RELAXED);
}

/* ===== argv building ===================================================== */

typedef struct {
    char **v; /* NULL-terminated once built */
    int n, cap;
    bool oom; /* an allocation failed: v is incomplete */
} Argv;

static void argv_push(Argv *a, const char *s, size_t len) {
    if (a->oom) return;
    if (a->n + 2 > a->cap) {
        int cap = a->cap ? 2 * a->cap : 16;
        char **v = krealloc(a->v, (size_t)cap * sizeof *v);
        if (!v) {
            a->oom = true;
            return;
        }
        a->v = v, a->cap = cap;
    }
    char *copy = kmalloc(len + 1);
    if (!copy) {
        a->oom = true;
        return;
    }
    memcpy(copy, s, len);
    copy[len] = '\0';
    a->v[a->n++] = copy;
    a->v[a->n] = NULL;
}

static void argv_add(Argv *a, const char *s) { argv_push(a, s, strlen(s)); }

/* Split s at blanks (no quoting: $CC and flags are words). */
static void argv_words(Argv *a, const char *s) {
    while (s && *s) {
        while (*s == ' ' || *s == '\t' || *s == '\n') s++;
        size_t len = strcspn(s, " \t\n");
        if (len) argv_push(a, s, len);
        s += len;
    }
}

static void argv_free(Argv *a) {
    for (int i = 0; i < a->n; i++) kfree(a->v[i]);
    kfree(a->v);
    memset(a, 0, sizeof *a);
}

/* ===== running a program ================================================ */

/* Read fd to EOF, keeping the first cap-1 bytes NUL-terminated in out. */
static void read_all(int fd, char *out, size_t cap) {
    size_t have = 0;
    char scratch[4096];
    for (;;) {
        char *dst = have + 1 < cap ? out + have : scratch;
        size_t room = have + 1 < cap ? cap - 1 - have : sizeof scratch;
        ssize_t r = read(fd, dst, room);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        if (dst != scratch) have += (size_t)r;
    }
    out[have] = '\0';
}

/* Run argv[0] (searched in PATH) with stdin from /dev/null and stdout and
 * stderr captured into out. Returns 0 with the wait status in *status, or
 * the errno that kept it from starting (ENOENT: no such program). */
/* Start argv[0] so; its output comes through *fd (spawn_wait reads it). */
static int spawn_start(char *const argv[], pid_t *pid, int *fd) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return errno;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    int rc = posix_spawnp(pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (rc != 0) close(fds[0]);
    *fd = rc == 0 ? fds[0] : -1;
    return rc;
}

/* Its output into out (the first cap - 1 bytes), its wait status. */
static int spawn_wait(pid_t pid, int fd, char *out, size_t cap, int *status) {
    read_all(fd, out, cap);
    close(fd);
    while (waitpid(pid, status, 0) < 0)
        if (errno != EINTR) return errno;
    return 0;
}

static int run_capture(char *const argv[], char *out, size_t cap, int *status) {
    pid_t pid;
    int fd, rc = spawn_start(argv, &pid, &fd);
    return rc != 0 ? rc : spawn_wait(pid, fd, out, cap, status);
}

/* ===== memoized facts about the compiler and the CPU ==================== */

static pthread_mutex_t memo_lock = PTHREAD_MUTEX_INITIALIZER;
static char memo_cc[JIT_PATH_MAX]; /* the $CC the version belongs to */
static char memo_version[256];     /* first line of `$CC --version` */
static char memo_cpu[65];          /* SHA-256 of /proc/cpuinfo's flags */

static kiln_status spawn_error(const char *cc, int rc, char *err, size_t errlen) {
    if (rc == ENOENT)
        return fail(err, errlen, KILN_ERR_ENV, "C compiler '%s' not found (set CC)", cc);
    return fail(err, errlen, KILN_ERR_ENV, "cannot run C compiler '%s': %s", cc, strerror(rc));
}

/* First line of `cc --version`; a compiler that fails it gets "?". */
static kiln_status query_version(const char *cc, char *ver, size_t len, char *err, size_t errlen) {
    Argv a = {0};
    argv_words(&a, cc); /* cc has a word: see job_init */
    argv_add(&a, "--version");
    if (a.oom) {
        argv_free(&a);
        return fail(err, errlen, KILN_ERR_NOMEM, "out of memory");
    }
    char out[1024];
    int status, rc = run_capture(a.v, out, sizeof out, &status);
    argv_free(&a);
    if (rc != 0) return spawn_error(cc, rc, err, errlen);
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    out[strcspn(out, "\n")] = '\0';
    util_fmt(ver, len, "%s", ok ? out : "?");
    return KILN_OK;
}

/* The "flags" line of /proc/cpuinfo, hashed ("" where there is none). */
static void query_cpu(char out[65]) {
    out[0] = '\0';
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[8192];
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "flags", 5) == 0 || strncmp(line, "Features", 8) == 0) {
            sha256_hex(line, strlen(line), out);
            break;
        }
    fclose(f);
}

/* The program $CC runs: its first word, searched in $PATH as posix_spawnp
 * does when it has no '/'. false when there is no such executable file. */
static bool resolve_compiler(const char *cc, char *path, size_t len) {
    char word[JIT_PATH_MAX];
    size_t at = strspn(cc, " \t\n"), n = strcspn(cc + at, " \t\n");
    if (n == 0 || n >= sizeof word) return false;
    memcpy(word, cc + at, n);
    word[n] = '\0';
    struct stat st;
    if (strchr(word, '/'))
        return fmt_fits(path, len, "%s", word) && stat(path, &st) == 0 && S_ISREG(st.st_mode);
    const char *dirs = getenv("PATH");
    if (!dirs) dirs = "/usr/local/bin:/usr/bin:/bin";
    for (const char *d = dirs;; d += strcspn(d, ":") + 1) {
        size_t dl = strcspn(d, ":");
        if (fmt_fits(path, len, "%.*s%s%s", (int)dl, d, dl ? "/" : "", word) &&
            stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0)
            return true;
        if (!d[dl]) return false;
    }
}

/* Running `$CC --version` in every process that compiles or loads a program
 * is a large part of a warm run (docs/decisions.md: The compiler's version
 * line kept in the cache), so its answer is also kept in the cache
 * directory, in a file named by a hash of $CC and of what identifies the
 * compiler's executable (path, device, inode, size, modification time): a
 * new or different compiler there is a new name. A wrapper (ccache) whose
 * underlying compiler changes keeps its recorded line until the wrapper
 * changes; the key then still holds the source, flags and CPU, so the old
 * object stays correct code. The file's path in *path, or false when the
 * compiler cannot be identified. */
static bool version_file(const char *cc, const char *dir, char *path, size_t len) {
    char exe[JIT_PATH_MAX], id[2 * JIT_PATH_MAX + 128], hex[65];
    struct stat st;
    if (!resolve_compiler(cc, exe, sizeof exe) || stat(exe, &st) != 0) return false;
    if (!fmt_fits(id, sizeof id, "%s\n%s\n%llu %llu %lld %lld.%09ld", cc, exe,
                  (unsigned long long)st.st_dev, (unsigned long long)st.st_ino,
                  (long long)st.st_size, (long long)st.st_mtim.tv_sec, (long)st.st_mtim.tv_nsec))
        return false;
    sha256_hex(id, strlen(id), hex);
    return fmt_fits(path, len, "%s/compiler-%.32s.version", dir, hex);
}

/* The kept version line (see version_file) into ver; false when absent. */
static bool read_version(const char *path, char *ver, size_t len) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool ok = fgets(ver, (int)len, f) != NULL;
    fclose(f);
    ver[strcspn(ver, "\n")] = '\0';
    return ok && ver[0];
}

static int mkdir_p(const char *dir);

/* Keep ver in path, through a unique temporary name; failures are ignored
 * (the next process asks the compiler again). */
static void write_version(const char *path, const char *dir, const char *ver) {
    char tmp[JIT_PATH_MAX + 32];
    util_fmt(tmp, sizeof tmp, "%s.tmp.%ld.%u", path, (long)getpid(), next_serial());
    if (mkdir_p(dir) != 0) return;
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    bool ok = fprintf(f, "%s\n", ver) > 0;
    if (fclose(f) != 0 || !ok || rename(tmp, path) != 0) unlink(tmp);
}

/* Fill ver and cpu, asking the compiler only when $CC changed and the
 * cache directory dir holds no line for it. */
static kiln_status compiler_facts(const char *cc, const char *dir, char *ver, size_t len,
                                  char cpu[65], char *err, size_t errlen) {
    kiln_status st = KILN_OK;
    pthread_mutex_lock(&memo_lock);
    if (!memo_cc[0] || strcmp(memo_cc, cc) != 0) {
        char vf[JIT_PATH_MAX];
        bool named = version_file(cc, dir, vf, sizeof vf);
        if (!named || !read_version(vf, memo_version, sizeof memo_version)) {
            st = query_version(cc, memo_version, sizeof memo_version, err, errlen);
            if (st == KILN_OK && named) write_version(vf, dir, memo_version);
        }
        util_fmt(memo_cc, sizeof memo_cc, "%s", st == KILN_OK ? cc : "");
        if (!memo_cpu[0]) query_cpu(memo_cpu);
    }
    util_fmt(ver, len, "%s", memo_version);
    memcpy(cpu, memo_cpu, 65);
    pthread_mutex_unlock(&memo_lock);
    return st;
}

/* ===== the cache directory ================================================ */

/* $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln. */
static kiln_status cache_dir(char *dir, size_t len, char *err, size_t errlen) {
    const char *e = getenv("KILN_CACHE_DIR");
    bool ok;
    if (e && *e)
        ok = fmt_fits(dir, len, "%s", e);
    else if ((e = getenv("XDG_CACHE_HOME")) && *e)
        ok = fmt_fits(dir, len, "%s/kiln", e);
    else if ((e = getenv("HOME")) && *e)
        ok = fmt_fits(dir, len, "%s/.cache/kiln", e);
    else
        return fail(err, errlen, KILN_ERR_ENV, "no cache directory: set KILN_CACHE_DIR or HOME");
    if (!ok) return fail(err, errlen, KILN_ERR_ENV, "cache directory path too long: %s", e);
    return KILN_OK;
}

/* mkdir -p with mode 0755; 0 or an errno value. */
static int mkdir_p(const char *dir) {
    char buf[JIT_PATH_MAX];
    util_fmt(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return errno;
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return errno;
    struct stat st;
    if (stat(buf, &st) != 0) return errno;
    return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
}

/* ===== one compile job ===================================================== */

typedef struct {
    const char *cc; /* $CC or "cc" */
    char *flags;    /* standard + extra flags, kmalloc'd */
    char key[JIT_KEY_HEX + 1];
    char dir[JIT_PATH_MAX];
    char *err;
    size_t errlen;
    JitStats *stats; /* holds the .so and .c paths */
} Job;

static void make_key(Job *j, const char *source, const char *ver, const char *cpu) {
    const char *parts[] = {"kiln-jit-1", source, j->flags, j->cc, ver, cpu};
    Sha256 s;
    char hex[65];
    sha_init(&s);
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        sha_update(&s, parts[i], strlen(parts[i]) + 1); /* NUL separates */
    sha_final_hex(&s, hex);
    memcpy(j->key, hex, JIT_KEY_HEX);
    j->key[JIT_KEY_HEX] = '\0';
}

/* Does the ELF file fd (of size bytes) hold every table its header points
 * at? dlopen maps a file without checking that, and touching a mapped page
 * past the end of a truncated file is SIGBUS, not an error. The program
 * headers are checked one by one (each loaded segment lies in the file);
 * the section headers sit at the end of a linker's output, so any
 * truncation cuts them off. NULL when whole, else what is wrong. */
static const char *elf_incomplete(int fd, uint64_t size) {
    ElfW(Ehdr) eh;
    if (pread(fd, &eh, sizeof eh, 0) != (ssize_t)sizeof eh ||
        memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0)
        return "not an ELF file";
    if (eh.e_ident[EI_CLASS] != (sizeof(void *) == 8 ? ELFCLASS64 : ELFCLASS32) ||
        eh.e_phentsize != sizeof(ElfW(Phdr)) || eh.e_phnum == 0)
        return "not an ELF object for this machine";
    uint64_t ph_end = (uint64_t)eh.e_phoff + (uint64_t)eh.e_phnum * sizeof(ElfW(Phdr));
    uint64_t sh_end = (uint64_t)eh.e_shoff + (uint64_t)eh.e_shnum * eh.e_shentsize;
    if (eh.e_phoff > size || ph_end > size || eh.e_shoff > size || sh_end > size)
        return "truncated ELF file";
    for (unsigned i = 0; i < eh.e_phnum; i++) {
        ElfW(Phdr) ph;
        off_t at = (off_t)(eh.e_phoff + (uint64_t)i * sizeof ph);
        if (pread(fd, &ph, sizeof ph, at) != (ssize_t)sizeof ph) return "truncated ELF file";
        if (ph.p_type == PT_LOAD && (ph.p_offset > size || ph.p_filesz > size - ph.p_offset))
            return "truncated ELF file";
    }
    return NULL;
}

/* Is this a loadable entry of our key? The handle, or NULL with why. */
static void *load_verified(const char *path, const char *key, char *why, size_t len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        util_fmt(why, len, "%s", strerror(errno));
        return NULL;
    }
    struct stat st;
    const char *bad =
        fstat(fd, &st) != 0 ? "cannot stat" : elf_incomplete(fd, (uint64_t)st.st_size);
    close(fd);
    if (bad) {
        util_fmt(why, len, "%s", bad);
        return NULL;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *d = dlerror();
        util_fmt(why, len, "%s", d ? d : "dlopen failed");
        return NULL;
    }
    char name[64];
    util_fmt(name, sizeof name, "kiln_jit_marker_%s", key);
    const char *marker = dlsym(h, name);
    if (!marker || strcmp(marker, key) != 0) {
        dlclose(h);
        util_fmt(why, len, "marker symbol %s missing", name);
        return NULL;
    }
    return h;
}

/* Write content to path through a unique temporary name and rename(). */
static kiln_status write_atomic(const Job *j, const char *path, const char *a, const char *b) {
    char tmp[JIT_PATH_MAX + 32];
    util_fmt(tmp, sizeof tmp, "%s.tmp.%ld.%u", path, (long)getpid(), next_serial());
    FILE *f = fopen(tmp, "w");
    if (!f)
        return fail(j->err, j->errlen, KILN_ERR_ENV, "cannot write to cache directory %s: %s",
                    j->dir, strerror(errno));
    bool ok = fputs(a, f) >= 0 && fputs(b, f) >= 0;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return fail(j->err, j->errlen, KILN_ERR_ENV, "cannot write %s: %s", path, strerror(e));
    }
    return KILN_OK;
}

static void marker_text(const Job *j, char marker[160]) {
    util_fmt(marker, 160,
             "\n/* kiln jit cache marker */\nconst char kiln_jit_marker_%s[] = \"%s\";\n", j->key,
             j->key);
}

static kiln_status write_source(const Job *j, const char *source) {
    char marker[160];
    marker_text(j, marker);
    return write_atomic(j, j->stats->src_path, source, marker);
}

/* The compiler's argv: cc words, flags, -o out, the source, -lm. */
/* The compiler's argv so far: the cc words, then the flags. */
static Argv cc_argv(const Job *j) {
    Argv a = {0};
    argv_words(&a, j->cc);
    argv_words(&a, j->flags);
    return a;
}

static Argv compile_argv(const Job *j, const char *out) {
    Argv a = cc_argv(j);
    argv_add(&a, "-o");
    argv_add(&a, out);
    argv_add(&a, j->stats->src_path);
    argv_add(&a, "-lm");
    return a;
}

static kiln_status compiler_failed(const Job *j, int status, const char *output) {
    if (WIFSIGNALED(status))
        return fail(j->err, j->errlen, KILN_ERR_ENV,
                    "C compiler '%s' killed by signal %d compiling %s (source kept)\n%s", j->cc,
                    WTERMSIG(status), j->stats->src_path, output);
    return fail(j->err, j->errlen, KILN_ERR_ENV,
                "C compiler '%s' failed (exit %d) compiling %s (source kept):\n%s", j->cc,
                WEXITSTATUS(status), j->stats->src_path, output);
}

/* A compiler run's outcome: rc, the errno that kept it from starting, or
 * else its wait status. */
static kiln_status compiler_outcome(const Job *j, int rc, int status, const char *output) {
    if (rc != 0) return spawn_error(j->cc, rc, j->err, j->errlen);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return compiler_failed(j, status, output);
    return KILN_OK;
}

/* The compiled tmp into place as the cached .so. */
static kiln_status into_place(Job *j, const char *tmp, const char *output) {
    if (rename(tmp, j->stats->path) == 0) return KILN_OK;
    int e = errno;
    bool no_object = e == ENOENT && access(tmp, F_OK) != 0;
    unlink(tmp);
    if (no_object)
        return fail(j->err, j->errlen, KILN_ERR_ENV,
                    "C compiler '%s' exited 0 but wrote no object compiling %s%s%s", j->cc,
                    j->stats->src_path, *output ? ":\n" : "", output);
    return fail(j->err, j->errlen, KILN_ERR_ENV, "cannot write %s: %s", j->stats->path,
                strerror(e));
}

/* Run the compiler into a temporary .so and rename it into place. */
static kiln_status compile_whole(Job *j) {
    char tmp[JIT_PATH_MAX + 32], output[JIT_OUT_MAX + 1];
    util_fmt(tmp, sizeof tmp, "%s.tmp.%ld.%u", j->stats->path, (long)getpid(), next_serial());
    Argv a = compile_argv(j, tmp);
    if (a.oom) {
        argv_free(&a);
        return fail(j->err, j->errlen, KILN_ERR_NOMEM, "out of memory");
    }
    int status = 0;
    int rc = run_capture(a.v, output, sizeof output, &status);
    argv_free(&a);
    kiln_status st = compiler_outcome(j, rc, status, output);
    if (st != KILN_OK) {
        unlink(tmp);
        return st;
    }
    return into_place(j, tmp, output);
}

/* ---- a large program in two translation units at once ---- */

/* Kernels of at least this many bytes of C (before kiln_entry) are
 * compiled as two translation units in parallel (where two CPUs are
 * online), each with the prelude and the prototypes (codegen:
 * CG_PROTOS_END; KILN_PART 1 and 2 make the kernels hidden globals), then
 * linked: on a 2-core Zen 1 mobilenet_v2 (36 KB of kernels) 1.29-1.45 ->
 * 0.79-0.87 s, resnet18 (16 KB) 0.59 -> 0.34-0.37 s (docs/decisions.md:
 * Two translation units). The smallest programs stay one unit: three
 * processes instead of one. */
#define JIT_SPLIT_MIN ((size_t)8 << 10)
static size_t split_min = JIT_SPLIT_MIN;

#ifdef KILN_TESTING
void jit_set_split_min(size_t bytes) { split_min = bytes ? bytes : JIT_SPLIT_MIN; }
#endif

/* Where source splits: *head the length of what both units repeat (to the
 * end of the prototypes), the return value where the second unit's part
 * starts: the comment above a function (CG_FN_COMMENT) nearest the middle
 * of the kernels before kiln_entry, which goes to the second unit (its
 * many calls compile fast: with the middle taken over it too, the first
 * unit took 2.2 s and the second 0.4), or 0: one unit. */
static size_t split_point(const char *source, size_t *head) {
    const char *end = strstr(source, CG_PROTOS_END "\n");
    const char *entry = end ? strstr(end, CG_ENTRY_COMMENT) : NULL;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (!entry || cpus < 2) return 0;
    *head = (size_t)(end - source) + strlen(CG_PROTOS_END "\n");
    size_t stop = (size_t)(entry - source), mid = *head + (stop - *head) / 2, best = 0;
    if (stop - *head < split_min) return 0;
    bool first = true; /* the first unit keeps at least one function */
    for (const char *p = strstr(source + *head, CG_FN_COMMENT); p && p < entry;
         p = strstr(p + 1, CG_FN_COMMENT)) {
        size_t at = (size_t)(p + 1 - source);
        if (first) {
            first = false;
            continue;
        }
        if (!best || (at > mid ? at - mid : mid - at) < (best > mid ? best - mid : mid - best))
            best = at;
    }
    return best;
}

/* Unit k's source: the head, then source[from, to), then tail. */
static bool write_unit(const char *path, const char *source, size_t head, size_t from, size_t to,
                       const char *tail) {
    FILE *f = fopen(path, "w");
    if (!f) return false;
    bool ok = fwrite(source, 1, head, f) == head &&
              fwrite(source + from, 1, to - from, f) == to - from && fputs(tail, f) >= 0;
    return (fclose(f) == 0) && ok;
}

static kiln_status compile_split(Job *j, const char *source, size_t head, size_t cut) {
    char base[JIT_PATH_MAX + 32], c[2][JIT_PATH_MAX + 40], o[2][JIT_PATH_MAX + 40];
    char so[JIT_PATH_MAX + 40], marker[160], output[2][JIT_OUT_MAX + 1];
    util_fmt(base, sizeof base, "%s.tmp.%ld.%u", j->stats->path, (long)getpid(), next_serial());
    util_fmt(so, sizeof so, "%s.so", base);
    marker_text(j, marker);
    kiln_status st = KILN_OK;
    size_t len = strlen(source);
    for (int k = 0; k < 2; k++) {
        util_fmt(c[k], sizeof c[k], "%s.%d.c", base, k + 1);
        util_fmt(o[k], sizeof o[k], "%s.%d.o", base, k + 1);
    }
    if (!write_unit(c[0], source, cut, cut, cut, "") ||
        !write_unit(c[1], source, head, cut, len, marker))
        st = fail(j->err, j->errlen, KILN_ERR_ENV, "cannot write to cache directory %s: %s", j->dir,
                  strerror(errno));
    pid_t pid[2];
    int fd[2], started = 0, status[2] = {0, 0}, rc = 0;
    Argv a[2] = {{0}, {0}};
    for (int k = 0; k < 2 && st == KILN_OK; k++) {
        a[k] = cc_argv(j);
        argv_add(&a[k], k ? "-DKILN_PART=2" : "-DKILN_PART=1");
        argv_add(&a[k], "-c");
        argv_add(&a[k], "-o");
        argv_add(&a[k], o[k]);
        argv_add(&a[k], c[k]);
        if (a[k].oom) st = fail(j->err, j->errlen, KILN_ERR_NOMEM, "out of memory");
    }
    for (int k = 0; k < 2 && st == KILN_OK && rc == 0; k++)
        if ((rc = spawn_start(a[k].v, &pid[k], &fd[k])) == 0) started++;
    for (int k = 0; k < started; k++)
        spawn_wait(pid[k], fd[k], output[k], sizeof output[k], &status[k]);
    if (st == KILN_OK && rc != 0) st = spawn_error(j->cc, rc, j->err, j->errlen);
    for (int k = 0; k < 2 && st == KILN_OK; k++) st = compiler_outcome(j, 0, status[k], output[k]);
    argv_free(&a[0]);
    argv_free(&a[1]);
    if (st == KILN_OK) { /* link */
        Argv l = cc_argv(j);
        argv_add(&l, "-o");
        argv_add(&l, so);
        argv_add(&l, o[0]);
        argv_add(&l, o[1]);
        argv_add(&l, "-lm");
        if (l.oom) st = fail(j->err, j->errlen, KILN_ERR_NOMEM, "out of memory");
        if (st == KILN_OK) {
            rc = run_capture(l.v, output[0], sizeof output[0], &status[0]);
            st = compiler_outcome(j, rc, status[0], output[0]);
        }
        argv_free(&l);
    }
    for (int k = 0; k < 2; k++) unlink(c[k]), unlink(o[k]);
    if (st != KILN_OK) {
        unlink(so);
        return st;
    }
    return into_place(j, so, output[0]);
}

static kiln_status compile_to_cache(Job *j, const char *source) {
    double t0 = util_now_ms();
    size_t head = 0, cut = split_point(source, &head);
    kiln_status st = cut ? compile_split(j, source, head, cut) : compile_whole(j);
    j->stats->compile_ms = util_now_ms() - t0;
    j->stats->units = cut ? 2 : 1;
    return st;
}

/* The kernels' OpenMP runtime must outlive them: if the host program does
 * not link it, the first dlopen brings it in, and the dlclose of the last
 * kernel would unload it under its own idle worker threads (a crash). So
 * whichever runtime is loaded is marked RTLD_NODELETE. */
static void pin_openmp_runtime(void) {
    static const char *const names[] = {"libgomp.so.1", "libomp.so.5", "libomp.so", "libiomp5.so"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
        if (h) dlclose(h);
    }
    dlerror();
}

/* A miss: write the source, compile, load. A fresh object that does not
 * load is deleted, so the cache never keeps it. */
static kiln_status build_and_load(Job *j, const char *source, void **handle) {
    kiln_status st = write_source(j, source);
    if (st == KILN_OK) st = compile_to_cache(j, source);
    if (st != KILN_OK) return st;
    char why[512];
    *handle = load_verified(j->stats->path, j->key, why, sizeof why);
    if (*handle) return KILN_OK;
    unlink(j->stats->path);
    return fail(j->err, j->errlen, KILN_ERR_ENV, "cannot load %s: %s", j->stats->path, why);
}

/* A hit if the entry loads; a broken entry is deleted (then rebuilt). */
static void *try_cached(const Job *j) {
    if (access(j->stats->path, F_OK) != 0) return NULL;
    char why[512];
    void *h = load_verified(j->stats->path, j->key, why, sizeof why);
    if (!h) unlink(j->stats->path);
    return h;
}

/* Is the first line of `cc --version` GCC's ("gcc (Debian 12.2.0-14)
 * 12.2.0", "cc (GCC) 13.2.1 ...")? Clang's names clang. */
static bool is_gcc(const char *ver) {
    return !strstr(ver, "clang") &&
           (strstr(ver, "gcc") || strstr(ver, "GCC") || !strncmp(ver, "cc ", 3));
}

/* cc, flags, key and paths of a job. */
static kiln_status job_init(Job *j, const char *source, const char *extra) {
    const char *cc = getenv("CC");
    j->cc = cc && cc[strspn(cc, " \t\n")] ? cc : "cc";
    char ver[256], cpu[65];
    kiln_status st = cache_dir(j->dir, sizeof j->dir, j->err, j->errlen);
    if (st == KILN_OK) st = compiler_facts(j->cc, j->dir, ver, sizeof ver, cpu, j->err, j->errlen);
    if (st != KILN_OK) return st;
    const char *gcc = is_gcc(ver) ? " " CG_GCC_FLAGS : "";
    size_t n = strlen(JIT_FLAGS) + strlen(gcc) + (extra ? strlen(extra) : 0) + 2;
    if (!(j->flags = kmalloc(n))) return fail(j->err, j->errlen, KILN_ERR_NOMEM, "out of memory");
    util_fmt(j->flags, n, "%s%s%s%s", JIT_FLAGS, gcc, extra && *extra ? " " : "",
             extra ? extra : "");
    make_key(j, source, ver, cpu);
    if (!fmt_fits(j->stats->path, sizeof j->stats->path, "%s/%s.so", j->dir, j->key) ||
        !fmt_fits(j->stats->src_path, sizeof j->stats->src_path, "%s/%s.c", j->dir, j->key))
        return fail(j->err, j->errlen, KILN_ERR_ENV, "cache directory path too long: %s", j->dir);
    int e = mkdir_p(j->dir);
    if (e)
        return fail(j->err, j->errlen, KILN_ERR_ENV, "cannot create cache directory %s: %s", j->dir,
                    strerror(e));
    return KILN_OK;
}

kiln_status jit_compile(const char *source, const char *extra_flags, JitLib **out, char *err,
                        size_t errlen, JitStats *stats) {
    JitStats local;
    Job j = {.err = err, .errlen = errlen, .stats = stats ? stats : &local};
    memset(j.stats, 0, sizeof *j.stats);
    *out = NULL;
    kiln_status st = job_init(&j, source, extra_flags);
    void *h = NULL;
    if (st == KILN_OK && (h = try_cached(&j)) != NULL)
        j.stats->cache_hit = 1;
    else if (st == KILN_OK)
        st = build_and_load(&j, source, &h);
    kfree(j.flags);
    if (st != KILN_OK) return st;
    if (!(*out = kmalloc(sizeof **out))) {
        dlclose(h);
        return fail(err, errlen, KILN_ERR_NOMEM, "out of memory");
    }
    (*out)->handle = h;
    pin_openmp_runtime();
    return KILN_OK;
}

void *jit_sym(JitLib *lib, const char *name) { return lib ? dlsym(lib->handle, name) : NULL; }

void jit_close(JitLib *lib) {
    if (!lib) return;
    dlclose(lib->handle);
    kfree(lib);
}
