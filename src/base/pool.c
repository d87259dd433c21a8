/* pool.c -- Pool, an Arena that longjmps when it runs out, and Str. */
#include "base/base.h"
#include <stdlib.h>
#include <string.h>

/* ===== Pool ================================================================ */

void *pool_alloc(Pool *p, size_t n) {
    void *r = arena_alloc(&p->arena, n ? n : 1);
    if (!r) {
        if (p->oom) longjmp(*p->oom, 1);
        abort();
    }
    return r;
}

char *pool_strdup(Pool *p, const char *s) {
    size_t n = strlen(s) + 1;
    char *d = pool_alloc(p, n);
    memcpy(d, s, n);
    return d;
}

char *pool_printf(Pool *p, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *d = pool_alloc(p, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(d, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return d;
}

void *pool_grow(Pool *p, void *arr, int *cap, int need, size_t item) {
    if (need <= *cap) return arr;
    int nc = *cap ? *cap * 2 : 8;
    while (nc < need) nc *= 2;
    void *na = pool_alloc(p, (size_t)nc * item);
    if (arr) memcpy(na, arr, (size_t)*cap * item);
    *cap = nc;
    return na;
}

void pool_free(Pool *p) {
    arena_free(&p->arena);
    p->arena.head = NULL;
}

void str_init(Str *s, Pool *p) {
    s->pool = p;
    s->s = NULL;
    s->n = s->cap = 0;
}

void str_putf(Str *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (s->n + (size_t)n + 1 > s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 64;
        while (nc < s->n + (size_t)n + 1) nc *= 2;
        char *ns = pool_alloc(s->pool, nc);
        if (s->s) memcpy(ns, s->s, s->n);
        s->s = ns;
        s->cap = nc;
    }
    va_start(ap, fmt);
    vsnprintf(s->s + s->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    s->n += (size_t)n;
}

const char *str_get(Str *s) { return s->s ? s->s : ""; }

int64_t loop_storage_size(kiln_dtype dt) { return dt == KILN_F64 ? 8 : 4; }

int64_t loop_elsize(kiln_dtype dt) {
    switch (dt) {
    case KILN_F64:
    case KILN_I64: return 8;
    case KILN_BOOL: return 1;
    default: return 4;
    }
}
