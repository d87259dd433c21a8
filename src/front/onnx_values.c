/*
 * onnx_values.c -- the ONNX importer's value table: every ONNX value name
 * (an initializer, a graph input, a node output) to its OxVal, an
 * open-addressing hash table in the importer's arena. onnx.c fills it
 * while reading a model, the op handlers (onnx_node.c and the files it
 * serves) read and set values through it; neither owns it.
 */
#include "front/front.h"
#include <string.h>

/* ---- values ----------------------------------------------------------------- */

int64_t ox_numel(const OxVal *v) {
    int64_t n = 1;
    for (int i = 0; i < v->rank; i++) n *= v->shape[i];
    return n;
}

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static OxVal **slot(OxImp *im, const char *name) {
    uint64_t h = hash_str(name);
    for (int k = 0;; k++) {
        OxVal **s = &im->tab[(h + (uint64_t)k) & (uint64_t)(im->cap - 1)];
        if (!*s || !strcmp((*s)->name, name)) return s;
    }
}

OxVal *ox_find(OxImp *im, const char *name) {
    OxVal *v = im->cap ? *slot(im, name) : NULL;
    return v && !v->dead ? v : NULL;
}

void ox_forget(OxImp *im, const char *name) {
    OxVal *v = ox_find(im, name);
    if (v) v->dead = true;
}

static bool grow(OxImp *im) {
    int cap = im->cap ? im->cap * 2 : 256;
    OxVal **old = im->tab;
    int oldcap = im->cap;
    im->tab = kcalloc((size_t)cap, sizeof *im->tab);
    if (!im->tab) {
        im->tab = old;
        return false;
    }
    im->cap = cap;
    for (int i = 0; i < oldcap; i++)
        if (old[i]) *slot(im, old[i]->name) = old[i];
    kfree(old);
    return true;
}

OxVal *ox_val(OxImp *im, const char *name) {
    if ((im->count + 1) * 2 > im->cap && !grow(im)) return NULL;
    OxVal **s = slot(im, name);
    if (*s && (*s)->dead) { /* back in scope, as new */
        const char *kept = (*s)->name;
        memset(*s, 0, sizeof **s);
        (*s)->name = kept;
        (*s)->v = KILN_NONE;
    }
    if (*s) return *s;
    OxVal *v = arena_alloc(&im->arena, sizeof *v);
    if (!v || !(v->name = arena_strdup(&im->arena, name))) return NULL;
    v->v = KILN_NONE;
    im->count++;
    return *s = v;
}
