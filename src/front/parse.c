/*
 * parse.c -- the .kiln text format -> graph, through the public builders.
 *
 * A recursive-descent parser, in the manner of chibicc, over the array of
 * tokens lex.c makes of the whole source up front (a bad character ends
 * that array with an ERROR token whose message is reported when the
 * parser reaches it, so errors always come out in source order and only
 * the first is reported).
 *
 * The parser evaluates as it goes: every expression becomes a Value, which is
 * a graph value built with kiln_* calls, or a literal (number, true/false,
 * None, a list of ints) that stays a literal until it is used. A number turns
 * into kiln_scalar only where a tensor is needed, so `dim=1` builds no node.
 * Calls are checked against one signature table (sigs[]): each function's
 * PyTorch name, parameter names, types, defaults and a small build function.
 * bind_args() does Python's argument binding (positional, keyword, varargs
 * for permute/reshape/expand) and convert() checks and normalizes each
 * argument, so the build functions are one call each.
 *
 * Errors look like "prog.kiln:3:9: error: MESSAGE", then the source line and
 * a caret line under the column. A builder's own error (a broadcast mismatch,
 * a dim out of range) is taken from the graph and re-reported at the operator
 * or function name that caused it. The parser allocates only its token array
 * and symbol table (freed on every path); Values live on the C stack.
 */
#include "front/front.h"
#include <errno.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum {
    MAX_LIST = 8,    /* longest [list] literal: shapes, dims, strides */
    MAX_ARGS = 16,   /* most arguments in one call */
    MAX_PARAMS = 8,  /* most parameters of any signature */
    MAX_DEPTH = 200, /* deepest expression nesting, to bound the C stack */
};

typedef struct {
    const char *name; /* points into the source; NULL: empty slot */
    int len;
    kiln_value v;
    int line; /* where it was defined, for "already defined" */
} Sym;

typedef struct {
    Graph *g;
    const char *src; /* lx.src and lx.len, the names the parser uses */
    int len;
    const char *file;  /* for messages */
    Lexer lx;          /* the tokens (lex.c) */
    const Token *toks; /* lx.toks once lexed */
    int ntoks;
    int cur;            /* the current token */
    const char *lexmsg; /* lx.lexmsg: the message of the T_ERROR token, if any */
    Sym *syms;          /* open-addressing hash table, cap a power of 2 */
    int nsyms, symcap;
    int depth;   /* expression nesting */
    bool failed; /* an error is recorded in g */
} Parser;

/* ===== errors ============================================================ */

/* The caret line: blanks up to col, tabs kept so the caret lines up, UTF-8
 * continuation bytes skipped so it counts characters. */
static void caret_line(const char *line, int col, char *buf, size_t size) {
    size_t n = 0;
    for (int i = 0; i < col - 1 && n + 2 < size; i++) {
        unsigned char c = (unsigned char)line[i];
        if ((c & 0xC0) == 0x80) continue;
        buf[n++] = c == '\t' ? '\t' : ' ';
    }
    buf[n++] = '^';
    buf[n] = '\0';
}

/* "FILE:LINE:COL: error: MSG", the source line, the caret line. A long line
 * is shown as a window around the column so the message fits the graph's
 * error buffer; LINE:COL stay exact. */
static void report(Parser *p, kiln_status st, const Token *t, const char *msg) {
    enum { WINDOW = 160 };
    const char *line = p->src + t->pos - (t->col - 1);
    int n = 0, col = t->col;
    while (line + n < p->src + p->len && line[n] != '\n') n++;
    if (n > 0 && line[n - 1] == '\r') n--;
    if (n > WINDOW) {
        int skip = col > WINDOW / 2 ? col - WINDOW / 2 : 0;
        line += skip;
        col -= skip;
        n = n - skip < WINDOW ? n - skip : WINDOW;
    }
    char caret[WINDOW + 8];
    caret_line(line, col, caret, sizeof caret);
    graph_fail(p->g, st, "%s:%d:%d: error: %s\n%.*s\n%s", p->file, t->line, t->col, msg, n, line,
               caret);
    p->failed = true;
}

/* Report an error at a token; returns false. At the tokenizer's ERROR token
 * its own message wins: that token is why nothing could be parsed there. */
__attribute__((format(printf, 3, 4))) static bool error_at(Parser *p, const Token *t,
                                                           const char *fmt, ...) {
    char msg[512];
    if (t->kind == T_ERROR) {
        util_fmt(msg, sizeof msg, "%s", p->lexmsg);
    } else {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
    }
    report(p, KILN_ERR_INPUT, t, msg);
    return false;
}

static bool nomem(Parser *p) {
    graph_fail(p->g, KILN_ERR_NOMEM, "%s: error: out of memory", p->file);
    p->failed = true;
    return false;
}

/* A builder call failed: re-report its message at the token that caused it
 * (an operator or a function name). An allocation failure is left as is. */
static bool reposition(Parser *p, const Token *at) {
    if (p->failed) return false; /* already reported with a position */
    if (p->g->status == KILN_ERR_NOMEM) {
        p->failed = true;
        return false;
    }
    char msg[sizeof p->g->err];
    util_fmt(msg, sizeof msg, "%s", kiln_error(p->g)[0] ? kiln_error(p->g) : "operation failed");
    graph_clear_error(p->g);
    return error_at(p, at, "%s", msg);
}

static bool built(Parser *p, kiln_value v, const Token *at) {
    return v != KILN_NONE || reposition(p, at);
}

/* ===== token helpers ===================================================== */

static const Token *peek(const Parser *p) { return &p->toks[p->cur]; }

static const Token *peek2(const Parser *p) {
    return &p->toks[p->cur + 1 < p->ntoks ? p->cur + 1 : p->cur];
}

static const Token *advance(Parser *p) {
    const Token *t = &p->toks[p->cur];
    if (t->kind != T_EOF) p->cur++;
    return t;
}

static bool tok_is(const Parser *p, const Token *t, TokKind kind, const char *s) {
    size_t n = strlen(s);
    return t->kind == kind && (size_t)t->len == n && !memcmp(p->src + t->pos, s, n);
}

static bool at_punct(const Parser *p, const char *s) { return tok_is(p, peek(p), T_PUNCT, s); }
static bool is_word(const Parser *p, const Token *t, const char *s) {
    return tok_is(p, t, T_NAME, s);
}

static bool accept(Parser *p, const char *s) {
    if (!at_punct(p, s)) return false;
    advance(p);
    return true;
}

static bool expect(Parser *p, const char *s, const char *msg) {
    return accept(p, s) || error_at(p, peek(p), "%s", msg);
}

/* A name token as a C string (names are at most LEX_MAX_NAME bytes). */
static void tok_name(const Parser *p, const Token *t, char buf[LEX_MAX_NAME + 1]) {
    memcpy(buf, p->src + t->pos, (size_t)t->len);
    buf[t->len] = '\0';
}

static bool expect_name(Parser *p, const char *msg, const Token **out) {
    if (peek(p)->kind != T_NAME) return error_at(p, peek(p), "%s", msg);
    *out = advance(p);
    return true;
}

/* ===== symbols =========================================================== */

static uint32_t hash(const char *s, int n) {
    uint32_t h = 2166136261u;
    for (int i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

/* The slot holding this name, or the empty slot where it would go. */
static Sym *sym_slot(Sym *tab, int cap, const char *s, int n) {
    for (uint32_t i = hash(s, n);; i++) {
        Sym *e = &tab[i & (uint32_t)(cap - 1)];
        if (!e->name || (e->len == n && !memcmp(e->name, s, (size_t)n))) return e;
    }
}

static Sym *sym_find(const Parser *p, const Token *t) {
    if (!p->symcap) return NULL;
    Sym *e = sym_slot(p->syms, p->symcap, p->src + t->pos, t->len);
    return e->name ? e : NULL;
}

static bool sym_grow(Parser *p) {
    int cap = p->symcap ? 2 * p->symcap : 64;
    Sym *tab = kcalloc((size_t)cap, sizeof *tab);
    if (!tab) return nomem(p);
    for (int i = 0; i < p->symcap; i++)
        if (p->syms[i].name) *sym_slot(tab, cap, p->syms[i].name, p->syms[i].len) = p->syms[i];
    kfree(p->syms);
    p->syms = tab;
    p->symcap = cap;
    return true;
}

static bool sym_add(Parser *p, const Token *name, kiln_value v) {
    if (2 * (p->nsyms + 1) > p->symcap && !sym_grow(p)) return false;
    Sym *e = sym_slot(p->syms, p->symcap, p->src + name->pos, name->len);
    *e = (Sym){p->src + name->pos, name->len, v, name->line};
    p->nsyms++;
    return true;
}

/* A name about to be defined must be new and not a literal's spelling. */
static bool check_new_name(Parser *p, const Token *name) {
    if (is_word(p, name, "true") || is_word(p, name, "false") || is_word(p, name, "None"))
        return error_at(p, name, "'%.*s' is a reserved word", name->len, p->src + name->pos);
    const Sym *s = sym_find(p, name);
    if (s)
        return error_at(p, name, "'%.*s' is already defined (at line %d)", name->len,
                        p->src + name->pos, s->line);
    return true;
}

static bool lookup(Parser *p, const Token *name, kiln_value *v) {
    const Sym *s = sym_find(p, name);
    if (!s) return error_at(p, name, "undefined name '%.*s'", name->len, p->src + name->pos);
    *v = s->v;
    return true;
}

/* ===== values ============================================================ */

typedef enum { V_ABSENT, V_TENSOR, V_NUMBER, V_BOOL, V_LIST, V_NONE, V_STRING, V_TENSORS } VKind;

/* What an expression evaluated to. Literals stay literals until a tensor is
 * needed (to_tensor), so an int argument never builds a node. */
typedef struct {
    VKind kind;
    const Token *at;        /* where the expression starts, for messages */
    kiln_value t;           /* V_TENSOR; KILN_NONE for None */
    double num;             /* V_NUMBER */
    bool is_int;            /* V_NUMBER written as an integer */
    int64_t ival;           /* V_NUMBER with is_int; V_BOOL: 0 or 1 */
    int n;                  /* V_LIST, V_TENSORS */
    int64_t list[MAX_LIST]; /* V_TENSORS: the tensors' values */
} Value;

static const char *describe(const Value *v) {
    switch (v->kind) {
    case V_TENSOR: return "a tensor";
    case V_NUMBER: return v->is_int ? "an int" : "a float";
    case V_BOOL: return "a boolean";
    case V_LIST: return "a list";
    case V_NONE: return "None";
    case V_STRING: return "a string";
    case V_TENSORS: return "a list of tensors";
    case V_ABSENT: break;
    }
    return "nothing";
}

static bool to_tensor(Parser *p, Value *v) {
    if (v->kind == V_TENSOR) return true;
    if (v->kind != V_NUMBER) return error_at(p, v->at, "expected a tensor, got %s", describe(v));
    v->t = kiln_scalar(p->g, v->num);
    v->kind = V_TENSOR;
    return built(p, v->t, v->at);
}

/* ===== signatures ======================================================== */

/* Argument types. convert() checks each and leaves it normalized: tensors
 * in .t (KILN_NONE for None), ints in .ival, numbers in .num, bools in
 * .ival, int-or-list in .list/.n. */
typedef enum {
    A_TENSOR,     /* a tensor or a number (becomes a scalar) */
    A_OPT_TENSOR, /* the same, or None */
    A_INT,        /* an int that fits a C int (a dim, groups) */
    A_I64,        /* any int (slice bounds) */
    A_SEED,       /* a non-negative int */
    A_NUM,        /* a number */
    A_OPT_NUM,    /* a number or None (clamp bounds) */
    A_BOOL,       /* true or false */
    A_DIMS,       /* an int, a list of ints, or None: reduction dims */
    A_INTS,       /* an int or a list of C ints (permute dims, stride) */
    A_SHAPE,      /* an int or a list of ints (reshape, expand, layer_norm) */
    A_STRING,     /* a string (pad's mode) */
    A_TENSORS,    /* a list of tensors (cat) */
} ArgType;

static const char *const type_desc[] = {
    [A_TENSOR] = "a tensor",
    [A_OPT_TENSOR] = "a tensor or None",
    [A_INT] = "an int",
    [A_I64] = "an int",
    [A_SEED] = "a non-negative int",
    [A_NUM] = "a number",
    [A_OPT_NUM] = "a number or None",
    [A_BOOL] = "true or false",
    [A_DIMS] = "an int, a list of ints or None",
    [A_INTS] = "an int or a list of ints",
    [A_SHAPE] = "an int or a list of ints",
    [A_STRING] = "a string",
    [A_TENSORS] = "a list of tensors",
};

typedef struct {
    const char *name;
    ArgType type;
    bool required;
    bool kwonly;  /* can only be given by keyword */
    bool varargs; /* also takes the remaining positional ints as a list */
    double def;   /* default of an absent int/number/bool */
} Param;

typedef struct Sig Sig;
typedef kiln_value (*BuildFn)(Parser *p, const Sig *s, const Value *a);

struct Sig {
    const char *name;
    BuildFn build;
    Param params[MAX_PARAMS]; /* ends at the first one with a NULL name */
};

static int nparams(const Sig *s) {
    int n = 0;
    while (n < MAX_PARAMS && s->params[n].name) n++;
    return n;
}

/* ----- build functions: one builder call each ---------------------------- */

static kiln_value b_unary(Parser *p, const Sig *s, const Value *a) {
    return kiln_unary(p->g, s->name, a[0].t);
}

static kiln_value b_binary(Parser *p, const Sig *s, const Value *a) {
    return kiln_binary(p->g, s->name, a[0].t, a[1].t);
}

static kiln_value b_where(Parser *p, const Sig *s, const Value *a) {
    (void)s;
    return kiln_where(p->g, a[0].t, a[1].t, a[2].t);
}

static kiln_value b_clamp(Parser *p, const Sig *s, const Value *a) {
    (void)s;
    return kiln_clamp(p->g, a[0].t, a[1].kind == V_NUMBER, a[1].num, a[2].kind == V_NUMBER,
                      a[2].num);
}

static void to_ints(const Value *v, int *out) {
    for (int i = 0; i < v->n; i++) out[i] = (int)v->list[i];
}

static kiln_value b_reduce(Parser *p, const Sig *s, const Value *a) {
    int dims[MAX_LIST];
    to_ints(&a[1], dims);
    return kiln_reduce(p->g, s->name, a[0].t, a[1].n, a[1].n ? dims : NULL, (int)a[2].ival);
}

static kiln_value b_softmax(Parser *p, const Sig *s, const Value *a) {
    return strcmp(s->name, "softmax") == 0 ? kiln_softmax(p->g, a[0].t, (int)a[1].ival)
                                           : kiln_log_softmax(p->g, a[0].t, (int)a[1].ival);
}

static kiln_value b_layer_norm(Parser *p, const Sig *s, const Value *a) {
    (void)s;
    return kiln_layer_norm(p->g, a[0].t, a[1].n, a[1].list, a[2].t, a[3].t, a[4].num);
}

static kiln_value b_batch_norm(Parser *p, const Sig *s, const Value *a) {
    (void)s;
    if (a[6].ival) {
        error_at(p, a[6].at, "batch_norm supports only inference (training=false)");
        return KILN_NONE;
    }
    return kiln_batch_norm(p->g, a[0].t, a[1].t, a[2].t, a[3].t, a[4].t, a[5].num);
}

static kiln_value b_transpose(Parser *p, const Sig *s, const Value *a) {
    (void)s;
    return kiln_transpose(p->g, a[0].t, (int)a[1].ival, (int)a[2].ival);
}

static kiln_value b_permute(Parser *p, const Sig *s, const Value *a) {
    (void)s;
    int dims[MAX_LIST];
    to_ints(&a[1], dims);
    return kiln_permute(p->g, a[0].t, a[1].n, dims);
}

static kiln_value b_reshape(Parser *p, const Sig *s, const Value *a) {
    (void)s;
    return kiln_reshape(p->g, a[0].t, a[1].n, a[1].list);
}

static kiln_value b_expand(Parser *p, const Sig *s, const Value *a) {
    (void)s;
    return kiln_expand(p->g, a[0].t, a[1].n, a[1].list);
}

static kiln_value b_slice(Parser *p, const Sig *s, const Value *a) {
    (void)s;
    return kiln_slice(p->g, a[0].t, (int)a[1].ival, a[2].ival, a[3].ival, a[4].ival);
}

static kiln_value b_matmul(Parser *p, const Sig *s, const Value *a) {
    (void)s;
    return kiln_matmul(p->g, a[0].t, a[1].t);
}

/* stride/padding/dilation: an int for both spatial dims, or a 2-list. */
static bool pair(Parser *p, const Sig *s, const Param *pr, const Value *v, int out[2]) {
    if (v->n != 1 && v->n != 2)
        return error_at(p, v->at, "argument '%s' of %s must be an int or a list of 2 ints",
                        pr->name, s->name);
    out[0] = (int)v->list[0];
    out[1] = (int)v->list[v->n - 1];
    return true;
}

static kiln_value b_conv2d(Parser *p, const Sig *s, const Value *a) {
    kiln_conv_params cp = kiln_conv_defaults();
    if (!pair(p, s, &s->params[3], &a[3], cp.stride) ||
        !pair(p, s, &s->params[4], &a[4], cp.padding) ||
        !pair(p, s, &s->params[5], &a[5], cp.dilation))
        return KILN_NONE;
    cp.groups = (int)a[6].ival;
    return kiln_conv2d(p->g, a[0].t, a[1].t, a[2].t, &cp);
}

/* numpy.take / ONNX Gather (not torch.gather): indices hold integral floats. */
static kiln_value b_gather(Parser *p, const Sig *s, const Value *a) {
    (void)s;
    return kiln_gather(p->g, a[0].t, a[1].t, (int)a[2].ival);
}

/* torch.nn.functional.conv_transpose2d's argument order: groups before dilation. */
static kiln_value b_conv_transpose2d(Parser *p, const Sig *s, const Value *a) {
    kiln_conv_transpose_params cp = {{1, 1}, {0, 0}, {0, 0}, {1, 1}, 1};
    if (!pair(p, s, &s->params[3], &a[3], cp.stride) ||
        !pair(p, s, &s->params[4], &a[4], cp.padding) ||
        !pair(p, s, &s->params[5], &a[5], cp.output_padding) ||
        !pair(p, s, &s->params[7], &a[7], cp.dilation))
        return KILN_NONE;
    cp.groups = (int)a[6].ival;
    return kiln_conv_transpose2d(p->g, a[0].t, a[1].t, a[2].t, &cp);
}

static kiln_value b_rand_like(Parser *p, const Sig *s, const Value *a) {
    (void)s;
    return kiln_rand_like(p->g, a[0].t, (uint64_t)a[1].ival);
}

/* training=false is PyTorch's eval mode, where dropout is the identity. */
static kiln_value b_dropout(Parser *p, const Sig *s, const Value *a) {
    (void)s;
    if (!a[3].ival) return a[0].t;
    return kiln_dropout(p->g, a[0].t, a[1].num, (uint64_t)a[2].ival);
}

/* The text of a string literal token, without its quotes. */
static bool string_is(const Parser *p, const Token *t, const char *s) {
    return t->len - 2 == (int)strlen(s) && !memcmp(p->src + t->pos + 1, s, strlen(s));
}

/* pad(input, pad, mode="constant", value=0): PyTorch's F.pad. pad holds
 * (before, after) pairs starting from the last dim; modes are "constant",
 * "replicate" (numpy's edge) and "reflect". */
static kiln_value b_pad(Parser *p, const Sig *s, const Value *a) {
    static const char *const modes[] = {"constant", "replicate", "reflect"};
    int mode = a[2].kind == V_STRING ? -1 : 0, rank = kiln_value_rank(p->g, a[0].t);
    for (int m = 0; m < 3 && mode < 0; m++)
        if (string_is(p, a[2].at, modes[m])) mode = m;
    if (mode < 0) {
        error_at(p, a[2].at, "pad: mode must be \"constant\", \"replicate\" or \"reflect\"");
        return KILN_NONE;
    }
    if (a[1].n % 2 || a[1].n > 2 * rank) {
        error_at(p, a[1].at,
                 "argument 'pad' of %s must hold pairs for at most %d dims, got %d "
                 "values",
                 s->name, rank, a[1].n);
        return KILN_NONE;
    }
    int64_t before[KILN_MAX_RANK] = {0}, after[KILN_MAX_RANK] = {0};
    for (int i = 0; i < a[1].n / 2; i++) {
        before[rank - 1 - i] = a[1].list[2 * i];
        after[rank - 1 - i] = a[1].list[2 * i + 1];
    }
    return kiln_pad(p->g, a[0].t, (kiln_pad_mode)mode, rank, before, after, a[3].num);
}

static kiln_value b_cat(Parser *p, const Sig *s, const Value *a) {
    (void)s;
    kiln_value xs[MAX_LIST];
    for (int i = 0; i < a[0].n; i++) xs[i] = (kiln_value)a[0].list[i];
    return kiln_concat(p->g, a[0].n, xs, (int)a[1].ival);
}

/* An int or a list of ns ints per spatial dim (padding: 2*ns gives begins
 * then ends, ONNX's pads). */
static bool pool_list(Parser *p, const Sig *s, const Value *v, const char *what, int ns, bool pairs,
                      int64_t *out, int64_t *out_end) {
    bool ok = v->n == 1 || v->n == ns || (pairs && v->n == 2 * ns);
    if (!ok)
        return error_at(p, v->at, "argument '%s' of %s must be an int or a list of %d ints%s", what,
                        s->name, ns, pairs ? " (or 2x that: begins, then ends)" : "");
    for (int i = 0; i < ns; i++) {
        out[i] = v->list[v->n == 1 ? 0 : i];
        if (out_end) out_end[i] = v->list[v->n == 2 * ns ? ns + i : v->n == 1 ? 0 : i];
    }
    return true;
}

/* max_poolNd(input, kernel_size, stride=None, padding=0, dilation=1,
 * ceil_mode=false); avg_poolNd(input, kernel_size, stride=None, padding=0,
 * ceil_mode=false, count_include_pad=true, *, dilation=1). */
static kiln_value b_pool(Parser *p, const Sig *s, const Value *a) {
    bool is_max = s->name[0] == 'm';
    kiln_pool_params q = {.nspatial = s->name[strlen(s->name) - 2] - '0'};
    const Value *dil = &a[is_max ? 4 : 6];
    if (!pool_list(p, s, &a[1], "kernel_size", q.nspatial, false, q.kernel, NULL) ||
        !pool_list(p, s, a[2].n ? &a[2] : &a[1], "stride", q.nspatial, false, q.stride, NULL) ||
        !pool_list(p, s, &a[3], "padding", q.nspatial, true, q.pad_begin, q.pad_end) ||
        !pool_list(p, s, dil, "dilation", q.nspatial, false, q.dilation, NULL))
        return KILN_NONE;
    q.ceil_mode = (int)a[is_max ? 5 : 4].ival;
    q.count_include_pad = !is_max && a[5].ival;
    return is_max ? kiln_max_pool(p->g, a[0].t, &q) : kiln_avg_pool(p->g, a[0].t, &q);
}

/* ----- the table ---------------------------------------------------------- */

#define REQ(n, t) \
    { n, t, true, false, false, 0 }
#define OPT(n, t, d) \
    { n, t, false, false, false, d }
#define KWONLY(n, t, d) \
    { n, t, false, true, false, d }
#define VARARGS(n, t) \
    { n, t, true, false, true, 0 }
#define INPUT REQ("input", A_TENSOR)
#define UNARY(name)              \
    {                            \
        name, b_unary, { INPUT } \
    }
#define BINARY(name)                                      \
    {                                                     \
        name, b_binary, { INPUT, REQ("other", A_TENSOR) } \
    }
#define REDUCE(name)                                                                \
    {                                                                               \
        name, b_reduce, { INPUT, OPT("dim", A_DIMS, 0), OPT("keepdim", A_BOOL, 0) } \
    }
#define MAX_POOL(name)                                                                             \
    {                                                                                              \
        name, b_pool, {                                                                            \
            INPUT, REQ("kernel_size", A_INTS), OPT("stride", A_DIMS, 0),                           \
                OPT("padding", A_INTS, 0), OPT("dilation", A_INTS, 1), OPT("ceil_mode", A_BOOL, 0) \
        }                                                                                          \
    }
#define AVG_POOL(name)                                                             \
    {                                                                              \
        name, b_pool, {                                                            \
            INPUT, REQ("kernel_size", A_INTS), OPT("stride", A_DIMS, 0),           \
                OPT("padding", A_INTS, 0), OPT("ceil_mode", A_BOOL, 0),            \
                OPT("count_include_pad", A_BOOL, 1), KWONLY("dilation", A_INTS, 1) \
        }                                                                          \
    }

/* Every function of the language, with PyTorch's names and argument order. */
static const Sig sigs[] = {
    UNARY("neg"),
    UNARY("abs"),
    UNARY("relu"),
    UNARY("sigmoid"),
    UNARY("tanh"),
    UNARY("exp"),
    UNARY("log"),
    UNARY("sqrt"),
    UNARY("rsqrt"),
    UNARY("sin"),
    UNARY("cos"),
    UNARY("erf"),
    UNARY("gelu"),
    UNARY("silu"),
    UNARY("floor"),
    UNARY("ceil"),
    UNARY("reciprocal"),
    UNARY("logical_not"),
    UNARY("contiguous"),
    BINARY("add"),
    BINARY("sub"),
    BINARY("mul"),
    BINARY("div"),
    BINARY("true_divide"),
    BINARY("pow"),
    BINARY("fmod"),
    BINARY("maximum"),
    BINARY("minimum"),
    BINARY("lt"),
    BINARY("le"),
    BINARY("gt"),
    BINARY("ge"),
    BINARY("eq"),
    BINARY("ne"),
    {"where", b_where, {REQ("condition", A_TENSOR), INPUT, REQ("other", A_TENSOR)}},
    {"clamp", b_clamp, {INPUT, OPT("min", A_OPT_NUM, 0), OPT("max", A_OPT_NUM, 0)}},
    REDUCE("sum"),
    REDUCE("mean"),
    REDUCE("amax"),
    REDUCE("amin"),
    REDUCE("prod"),
    {"softmax", b_softmax, {INPUT, REQ("dim", A_INT)}},
    {"log_softmax", b_softmax, {INPUT, REQ("dim", A_INT)}},
    {"layer_norm",
     b_layer_norm,
     {INPUT, REQ("normalized_shape", A_SHAPE), OPT("weight", A_OPT_TENSOR, 0),
      OPT("bias", A_OPT_TENSOR, 0), OPT("eps", A_NUM, 1e-5)}},
    {"batch_norm",
     b_batch_norm,
     {INPUT, REQ("running_mean", A_TENSOR), REQ("running_var", A_TENSOR),
      OPT("weight", A_OPT_TENSOR, 0), OPT("bias", A_OPT_TENSOR, 0), OPT("eps", A_NUM, 1e-5),
      KWONLY("training", A_BOOL, 0)}},
    {"transpose", b_transpose, {INPUT, REQ("dim0", A_INT), REQ("dim1", A_INT)}},
    {"permute", b_permute, {INPUT, VARARGS("dims", A_INTS)}},
    {"reshape", b_reshape, {INPUT, VARARGS("shape", A_SHAPE)}},
    {"expand", b_expand, {INPUT, VARARGS("size", A_SHAPE)}},
    {"slice",
     b_slice,
     {INPUT, REQ("dim", A_INT), REQ("start", A_I64), REQ("end", A_I64), OPT("step", A_I64, 1)}},
    {"pad", b_pad, {INPUT, REQ("pad", A_INTS), OPT("mode", A_STRING, 0), OPT("value", A_NUM, 0)}},
    {"cat", b_cat, {REQ("tensors", A_TENSORS), OPT("dim", A_INT, 0)}},
    MAX_POOL("max_pool1d"),
    MAX_POOL("max_pool2d"),
    MAX_POOL("max_pool3d"),
    AVG_POOL("avg_pool1d"),
    AVG_POOL("avg_pool2d"),
    AVG_POOL("avg_pool3d"),
    {"matmul", b_matmul, {INPUT, REQ("other", A_TENSOR)}},
    {"conv2d",
     b_conv2d,
     {INPUT, REQ("weight", A_TENSOR), OPT("bias", A_OPT_TENSOR, 0), OPT("stride", A_INTS, 1),
      OPT("padding", A_INTS, 0), OPT("dilation", A_INTS, 1), OPT("groups", A_INT, 1)}},
    {"gather", b_gather, {INPUT, REQ("indices", A_TENSOR), OPT("axis", A_INT, 0)}},
    {"conv_transpose2d",
     b_conv_transpose2d,
     {INPUT, REQ("weight", A_TENSOR), OPT("bias", A_OPT_TENSOR, 0), OPT("stride", A_INTS, 1),
      OPT("padding", A_INTS, 0), OPT("output_padding", A_INTS, 0), OPT("groups", A_INT, 1),
      OPT("dilation", A_INTS, 1)}},
    {"rand_like", b_rand_like, {INPUT, OPT("seed", A_SEED, 0)}},
    {"dropout",
     b_dropout,
     {INPUT, OPT("p", A_NUM, 0.5), OPT("seed", A_SEED, 0), KWONLY("training", A_BOOL, 1)}},
};

static const Sig *find_sig(const Parser *p, const Token *name) {
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        if (is_word(p, name, sigs[i].name)) return &sigs[i];
    return NULL;
}

/* ===== argument binding ================================================== */

typedef struct {
    const Token *kw; /* the keyword, or NULL for a positional argument */
    Value v;
} Arg;

static bool arg_error(Parser *p, const Sig *s, const Param *pr, const Value *v) {
    return error_at(p, v->at, "argument '%s' of %s must be %s, got %s", pr->name, s->name,
                    type_desc[pr->type], describe(v));
}

static bool fits_int(int64_t v) { return v >= INT_MIN && v <= INT_MAX; }

/* An absent optional parameter takes its default. */
static void set_default(const Param *pr, Value *v) {
    v->kind = V_NUMBER;
    v->is_int = true;
    v->ival = (int64_t)pr->def;
    v->num = pr->def;
    v->t = KILN_NONE;
    v->n = 0;
    if (pr->type == A_OPT_TENSOR || pr->type == A_OPT_NUM) v->kind = V_NONE;
    if (pr->type == A_BOOL) v->kind = V_BOOL;
    if (pr->type == A_INTS || pr->type == A_SHAPE) {
        v->kind = V_LIST;
        v->n = 1;
        v->list[0] = v->ival;
    }
    if (pr->type == A_DIMS) v->kind = V_LIST;
}

static bool convert_int(Parser *p, const Sig *s, const Param *pr, Value *v) {
    if (v->kind != V_NUMBER || !v->is_int) return arg_error(p, s, pr, v);
    if (pr->type == A_INT && !fits_int(v->ival))
        return error_at(p, v->at, "argument '%s' of %s is out of range", pr->name, s->name);
    if (pr->type == A_SEED && v->ival < 0)
        return error_at(p, v->at, "argument '%s' of %s must be non-negative", pr->name, s->name);
    return true;
}

/* An int becomes a list of one; C-int lists are range checked. */
static bool convert_list(Parser *p, const Sig *s, const Param *pr, Value *v) {
    if (v->kind == V_NONE && pr->type == A_DIMS) {
        v->kind = V_LIST;
        v->n = 0;
        return true;
    }
    if (v->kind == V_NUMBER && v->is_int) {
        v->kind = V_LIST;
        v->n = 1;
        v->list[0] = v->ival;
    }
    if (v->kind != V_LIST) return arg_error(p, s, pr, v);
    for (int i = 0; pr->type != A_SHAPE && i < v->n; i++)
        if (!fits_int(v->list[i]))
            return error_at(p, v->at, "argument '%s' of %s is out of range", pr->name, s->name);
    return true;
}

static bool convert(Parser *p, const Sig *s, const Param *pr, Value *v) {
    if (v->kind == V_ABSENT) {
        set_default(pr, v);
        return true;
    }
    switch (pr->type) {
    case A_OPT_TENSOR:
        if (v->kind == V_NONE) {
            v->t = KILN_NONE;
            return true;
        }
        /* fall through */
    case A_TENSOR:
        if (v->kind != V_TENSOR && v->kind != V_NUMBER) return arg_error(p, s, pr, v);
        return to_tensor(p, v);
    case A_INT:
    case A_I64:
    case A_SEED: return convert_int(p, s, pr, v);
    case A_OPT_NUM:
        if (v->kind == V_NONE) return true;
        /* fall through */
    case A_NUM: return v->kind == V_NUMBER || arg_error(p, s, pr, v);
    case A_BOOL: return v->kind == V_BOOL || arg_error(p, s, pr, v);
    case A_DIMS:
    case A_INTS:
    case A_SHAPE: return convert_list(p, s, pr, v);
    case A_STRING: return v->kind == V_STRING || arg_error(p, s, pr, v);
    case A_TENSORS: return v->kind == V_TENSORS || arg_error(p, s, pr, v);
    }
    return false;
}

static int positional_params(const Sig *s) {
    int n = 0;
    for (int i = 0; i < nparams(s); i++) n += !s->params[i].kwonly;
    return n;
}

static bool too_many(Parser *p, const Sig *s, const Value *extra, int given) {
    int max = positional_params(s), req = 0;
    for (int i = 0; i < nparams(s); i++) req += s->params[i].required;
    return error_at(p, extra->at, "%s takes %s%d positional argument%s, got %d", s->name,
                    req == max ? "" : "at most ", max, max == 1 ? "" : "s", given);
}

/* The varargs form permute(x, 1, 0): args[*i..] up to the first keyword
 * are ints gathered into one list. */
static bool gather(Parser *p, const Sig *s, const Param *pr, const Arg *args, int n, int *i,
                   Value *out) {
    *out = (Value){.kind = V_LIST, .at = args[*i].v.at};
    for (; *i < n && !args[*i].kw; (*i)++) {
        const Value *e = &args[*i].v;
        if (e->kind != V_NUMBER || !e->is_int)
            return error_at(p, e->at, "argument '%s' of %s must be a list of ints, got %s",
                            pr->name, s->name, describe(e));
        if (out->n == MAX_LIST)
            return error_at(p, e->at, "too many values for '%s' (at most %d)", pr->name, MAX_LIST);
        out->list[out->n++] = e->ival;
    }
    (*i)--;
    return true;
}

static int positional_args(const Arg *args, int n) {
    int k = 0;
    while (k < n && !args[k].kw) k++;
    return k;
}

static bool bind_keyword(Parser *p, const Sig *s, const Arg *a, Value *bound, char *how) {
    for (int k = 0; k < nparams(s); k++) {
        if (!is_word(p, a->kw, s->params[k].name)) continue;
        if (how[k] == 'k')
            return error_at(p, a->kw, "duplicate keyword argument '%s'", s->params[k].name);
        if (how[k] == 'p')
            return error_at(p, a->kw, "%s got multiple values for argument '%s'", s->name,
                            s->params[k].name);
        how[k] = 'k';
        bound[k] = a->v;
        return true;
    }
    return error_at(p, a->kw, "%s has no keyword '%.*s'", s->name, a->kw->len, p->src + a->kw->pos);
}

/* Every required parameter is given; each argument is checked and each
 * absent one defaulted. */
static bool check_bound(Parser *p, const Sig *s, const Token *fn, const char *how, Value *bound) {
    for (int k = 0; k < nparams(s); k++)
        if (s->params[k].required && !how[k])
            return error_at(p, fn, "%s is missing required argument '%s'", s->name,
                            s->params[k].name);
    for (int k = 0; k < nparams(s); k++)
        if (!convert(p, s, &s->params[k], &bound[k])) return false;
    return true;
}

/* Python's binding: positionals fill parameters in order, keywords by name;
 * then every parameter is checked and defaulted (convert). */
static bool bind_args(Parser *p, const Sig *s, const Token *fn, const Arg *args, int n,
                      Value *bound) {
    char how[MAX_PARAMS] = {0}; /* 'p' positional, 'k' keyword, 0 absent */
    int npos = 0, given = positional_args(args, n);
    for (int k = 0; k < MAX_PARAMS; k++) bound[k] = (Value){.kind = V_ABSENT, .at = fn};
    for (int i = 0; i < n; i++) {
        if (args[i].kw) {
            if (!bind_keyword(p, s, &args[i], bound, how)) return false;
            continue;
        }
        if (npos >= positional_params(s)) return too_many(p, s, &args[i].v, given);
        const Param *pr = &s->params[npos];
        if (pr->varargs && args[i].v.kind != V_LIST) {
            if (!gather(p, s, pr, args, n, &i, &bound[npos])) return false;
        } else {
            bound[npos] = args[i].v;
        }
        how[npos++] = 'p';
    }
    return check_bound(p, s, fn, how, bound);
}

/* ===== expressions ======================================================= */

static bool parse_expr(Parser *p, Value *out);

/* args := [arg (',' arg)* [',']] ')';  arg := expr | NAME '=' expr */
static bool parse_args(Parser *p, Arg *args, int *n) {
    bool seen_kw = false;
    for (*n = 0; !at_punct(p, ")");) {
        if (*n == MAX_ARGS)
            return error_at(p, peek(p), "too many arguments (at most %d)", MAX_ARGS);
        Arg *a = &args[*n];
        a->kw = NULL;
        if (peek(p)->kind == T_NAME && tok_is(p, peek2(p), T_PUNCT, "=")) {
            a->kw = advance(p);
            advance(p);
            seen_kw = true;
        } else if (seen_kw) {
            return error_at(p, peek(p), "positional argument follows keyword argument");
        }
        if (!parse_expr(p, &a->v)) return false;
        (*n)++;
        if (!accept(p, ",")) break;
    }
    return expect(p, ")", "expected ')' after arguments");
}

/* NAME '(' args ')': the function is looked up before its arguments are
 * parsed, so "unknown function" comes first. */
static bool parse_call(Parser *p, Value *out) {
    const Token *fn = advance(p);
    const Sig *s = find_sig(p, fn);
    if (!s) return error_at(p, fn, "unknown function '%.*s'", fn->len, p->src + fn->pos);
    advance(p); /* '(' */
    Arg args[MAX_ARGS];
    Value a[MAX_PARAMS];
    int n;
    if (!parse_args(p, args, &n) || !bind_args(p, s, fn, args, n, a)) return false;
    *out = (Value){.kind = V_TENSOR, .at = fn, .t = s->build(p, s, a)};
    return built(p, out->t, fn);
}

/* '[' [expr (',' expr)* [',']] ']' where every element is an int literal. */
static bool parse_list(Parser *p, Value *out) {
    *out = (Value){.kind = V_LIST, .at = advance(p)};
    while (!at_punct(p, "]")) {
        if (out->n == MAX_LIST)
            return error_at(p, peek(p), "list has too many elements (at most %d)", MAX_LIST);
        Value e;
        if (!parse_expr(p, &e)) return false;
        if (out->n == 0 && e.kind == V_TENSOR) out->kind = V_TENSORS; /* cat([a, b]) */
        if (out->kind == V_TENSORS ? e.kind != V_TENSOR : e.kind != V_NUMBER || !e.is_int)
            return error_at(p, e.at, "list elements must be %s, got %s",
                            out->kind == V_TENSORS ? "tensors" : "ints", describe(&e));
        out->list[out->n++] = out->kind == V_TENSORS ? e.t : e.ival;
        if (!accept(p, ",")) break;
    }
    return expect(p, "]", "expected ']' after list elements");
}

static bool parse_name(Parser *p, Value *out) {
    const Token *t = peek(p);
    *out = (Value){.at = t, .t = KILN_NONE};
    if (is_word(p, t, "true") || is_word(p, t, "false")) {
        out->kind = V_BOOL;
        out->ival = is_word(p, t, "true");
    } else if (is_word(p, t, "None")) {
        out->kind = V_NONE;
    } else if (tok_is(p, peek2(p), T_PUNCT, "(")) {
        return parse_call(p, out);
    } else {
        out->kind = V_TENSOR;
        if (!lookup(p, t, &out->t)) return false;
    }
    advance(p);
    return true;
}

/* primary := NUMBER | true | false | None | NAME | call | '(' expr ')' | list */
static bool parse_primary(Parser *p, Value *out) {
    const Token *t = peek(p);
    if (t->kind == T_NUMBER) {
        advance(p);
        *out =
            (Value){.kind = V_NUMBER, .at = t, .num = t->num, .is_int = t->is_int, .ival = t->ival};
        return true;
    }
    if (t->kind == T_NAME) return parse_name(p, out);
    if (t->kind == T_STRING) { /* a mode name: pad(..., mode="reflect") */
        advance(p);
        *out = (Value){.kind = V_STRING, .at = t};
        return true;
    }
    if (at_punct(p, "[")) return parse_list(p, out);
    if (!accept(p, "(")) return error_at(p, t, "expected expression");
    if (!parse_expr(p, out) || !expect(p, ")", "expected ')'")) return false;
    out->at = t;
    return true;
}

/* Unary minus folds into a number literal; on a tensor it is neg. */
static bool negate(Parser *p, Value *v, const Token *minus) {
    if (v->kind == V_NUMBER) {
        v->num = -v->num;
        v->ival = -v->ival;
    } else {
        if (!to_tensor(p, v)) return false;
        v->t = kiln_unary(p->g, "neg", v->t);
        if (!built(p, v->t, minus)) return false;
    }
    v->at = minus;
    return true;
}

/* unary := '-' unary | primary.  Every level of nesting passes here, so it
 * is where the depth is bounded. */
static bool parse_unary(Parser *p, Value *out) {
    if (p->depth >= MAX_DEPTH) return error_at(p, peek(p), "expression nested too deeply");
    p->depth++;
    bool ok;
    if (at_punct(p, "-")) {
        const Token *minus = advance(p);
        ok = parse_unary(p, out) && negate(p, out, minus);
    } else {
        ok = parse_primary(p, out);
    }
    p->depth--;
    return ok;
}

typedef struct {
    const char *sym, *op;
} BinOp;

static const BinOp CMP_OPS[] = {{"<", "lt"},  {"<=", "le"}, {">", "gt"}, {">=", "ge"},
                                {"==", "eq"}, {"!=", "ne"}, {NULL, NULL}};
static const BinOp ADD_OPS[] = {{"+", "add"}, {"-", "sub"}, {NULL, NULL}};
static const BinOp MUL_OPS[] = {{"*", "mul"}, {"/", "div"}, {"@", "matmul"}, {NULL, NULL}};

/* The op of the current token if it is one of ops, else NULL. */
static const char *binop_at(const Parser *p, const BinOp *ops) {
    for (; ops->sym; ops++)
        if (at_punct(p, ops->sym)) return ops->op;
    return NULL;
}

/* lhs = lhs OP rhs; a builder error is reported at the operator. */
static bool apply_binary(Parser *p, const char *op, const Token *at, Value *lhs, Value *rhs) {
    if (!to_tensor(p, lhs) || !to_tensor(p, rhs)) return false;
    lhs->t = strcmp(op, "matmul") == 0 ? kiln_matmul(p->g, lhs->t, rhs->t)
                                       : kiln_binary(p->g, op, lhs->t, rhs->t);
    return built(p, lhs->t, at);
}

/* A left-associative level: operand ((op) operand)*. */
static bool parse_level(Parser *p, const BinOp *ops, bool (*operand)(Parser *, Value *),
                        Value *out) {
    if (!operand(p, out)) return false;
    for (const char *op; (op = binop_at(p, ops));) {
        const Token *at = advance(p);
        Value rhs;
        if (!operand(p, &rhs) || !apply_binary(p, op, at, out, &rhs)) return false;
    }
    return true;
}

/* term := unary (('*' | '/' | '@') unary)*   ('@' binds like '*', as in Python) */
static bool parse_term(Parser *p, Value *out) { return parse_level(p, MUL_OPS, parse_unary, out); }

/* additive := term (('+' | '-') term)* */
static bool parse_additive(Parser *p, Value *out) {
    return parse_level(p, ADD_OPS, parse_term, out);
}

/* comparison := additive [cmp additive]; comparisons do not chain. */
static bool parse_expr(Parser *p, Value *out) {
    if (!parse_additive(p, out)) return false;
    const char *op = binop_at(p, CMP_OPS);
    if (!op) return true;
    const Token *at = advance(p);
    Value rhs;
    if (!parse_additive(p, &rhs) || !apply_binary(p, op, at, out, &rhs)) return false;
    if (binop_at(p, CMP_OPS)) return error_at(p, peek(p), "comparisons cannot be chained");
    return true;
}

/* ===== types and weights ================================================= */

typedef struct {
    const Token *dtok; /* the dtype, for messages */
    kiln_dtype dtype;
    int rank;
    int64_t shape[KILN_MAX_RANK];
} Type;

static void format_shape(char *buf, size_t size, int rank, const int64_t *shape) {
    size_t n = 0;
    n += (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < rank && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < size) snprintf(buf + n, size - n, "]");
}

static bool parse_dtype(Parser *p, Type *ty) {
    const Token *t = ty->dtok = peek(p);
    if (t->kind != T_NAME) return error_at(p, t, "expected a type such as f32[2, 3]");
    if (is_word(p, t, "f32"))
        ty->dtype = KILN_F32;
    else if (is_word(p, t, "bool"))
        ty->dtype = KILN_BOOL;
    else if (is_word(p, t, "f64"))
        ty->dtype = KILN_F64;
    else if (is_word(p, t, "i32") || is_word(p, t, "i64"))
        return error_at(p, t,
                        "dtype '%.*s' is not supported: programs compute in f32, f64 and bool",
                        t->len, p->src + t->pos);
    else
        return error_at(p, t, "unknown dtype '%.*s'", t->len, p->src + t->pos);
    advance(p);
    return true;
}

static bool parse_dim(Parser *p, int64_t *dim) {
    const Token *t = peek(p), *n = peek2(p);
    if (tok_is(p, t, T_PUNCT, "-") && n->kind == T_NUMBER && n->is_int)
        return error_at(p, t, "dim must not be negative, got -%.*s", n->len, p->src + n->pos);
    if (t->kind != T_NUMBER || !t->is_int) return error_at(p, t, "expected a dim (0 or more)");
    *dim = t->ival;
    advance(p);
    return true;
}

/* type := DTYPE '[' [dim (',' dim)* [',']] ']' */
static bool parse_type(Parser *p, Type *ty) {
    if (!parse_dtype(p, ty)) return false;
    const Token *lb = peek(p);
    if (!expect(p, "[", "expected '[' after the dtype")) return false;
    for (ty->rank = 0; !at_punct(p, "]");) {
        if (ty->rank == KILN_MAX_RANK)
            return error_at(p, peek(p), "too many dims: rank is at most %d", KILN_MAX_RANK);
        if (!parse_dim(p, &ty->shape[ty->rank++])) return false;
        if (!accept(p, ",")) break;
    }
    if (!expect(p, "]", "expected ',' or ']' in the shape")) return false;
    if (util_numel(ty->rank, ty->shape) < 0) {
        char s[256];
        format_shape(s, sizeof s, ty->rank, ty->shape);
        return error_at(p, lb, "shape %s has too many elements", s);
    }
    return true;
}

/* A string literal's contents with escapes resolved, prefixed by dir. */
static char *string_path(const Parser *p, const Token *t, const char *dir, int dirlen) {
    char *s = kmalloc((size_t)dirlen + (size_t)t->len + 1);
    if (!s) return NULL;
    memcpy(s, dir, (size_t)dirlen);
    int n = dirlen;
    for (int i = t->pos + 1; i < t->pos + t->len - 1; i++) {
        if (p->src[i] == '\\') i++;
        s[n++] = p->src[i];
    }
    s[n] = '\0';
    return s;
}

/* file("w.npy"): the path is relative to the program's directory. */
static char *resolve_path(const Parser *p, const Token *t) {
    const char *slash = strrchr(p->file, '/');
    bool absolute = t->len > 2 && p->src[t->pos + 1] == '/';
    int dirlen = slash && !absolute ? (int)(slash - p->file + 1) : 0;
    return string_path(p, t, p->file, dirlen);
}

static bool check_loaded(Parser *p, const Token *at, const char *path, const char *wname,
                         const Type *ty, const kiln_tensor *t) {
    if (t->dtype != KILN_F32)
        return error_at(p, at, "%s holds %s data, weight '%s' must be f32", path,
                        kiln_dtype_name(t->dtype), wname);
    bool same = t->rank == ty->rank;
    for (int i = 0; same && i < t->rank; i++) same = t->shape[i] == ty->shape[i];
    if (same) return true;
    char have[256], want[256];
    format_shape(have, sizeof have, t->rank, t->shape);
    format_shape(want, sizeof want, ty->rank, ty->shape);
    return error_at(p, at, "%s has shape %s, weight '%s' is declared %s", path, have, wname, want);
}

/* Load a weight from a .npy file: exactly f32 and exactly the declared shape. */
static bool load_file(Parser *p, const Token *at, const char *wname, const Type *ty,
                      kiln_tensor *data) {
    char *path = resolve_path(p, at);
    if (!path) return nomem(p);
    char err[512];
    kiln_status st = kiln_npy_read(path, data, err, sizeof err);
    bool ok = st == KILN_OK          ? check_loaded(p, at, path, wname, ty, data)
              : st == KILN_ERR_NOMEM ? nomem(p)
                                     : error_at(p, at, "cannot load weight '%s': %s", wname, err);
    kfree(path);
    return ok;
}

/* Weight data of the declared shape, filled by the initializer. */
static bool alloc_weight(Parser *p, const Token *at, const Type *ty, kiln_tensor *data) {
    data->rank = ty->rank;
    memcpy(data->shape, ty->shape, sizeof ty->shape);
    if (kiln_tensor_alloc(data) == KILN_OK) return true;
    char s[256], msg[300];
    format_shape(s, sizeof s, ty->rank, ty->shape);
    util_fmt(msg, sizeof msg, "out of memory for a weight of shape %s", s);
    report(p, KILN_ERR_NOMEM, at, msg);
    return false;
}

static void fill(float *data, int64_t n, float v) {
    for (int64_t i = 0; i < n; i++) data[i] = v;
}

/* randn '(' seed ')' */
static bool parse_randn(Parser *p, const Type *ty, const Token *init, kiln_tensor *data) {
    if (!expect(p, "(", "expected '(' after randn")) return false;
    const Token *seed = peek(p);
    if (seed->kind != T_NUMBER || !seed->is_int)
        return error_at(p, seed, "expected an integer seed");
    advance(p);
    if (!expect(p, ")", "expected ')' after the seed") || !alloc_weight(p, init, ty, data))
        return false;
    kiln_fill_randn(data->data, kiln_tensor_numel(data), (uint64_t)seed->ival);
    return true;
}

/* zeros ['(' ')'] | ones ['(' ')'] */
static bool parse_const_init(Parser *p, const Type *ty, const Token *init, kiln_tensor *data) {
    if (accept(p, "(") && !expect(p, ")", "expected ')'")) return false;
    if (!alloc_weight(p, init, ty, data)) return false;
    fill(data->data, kiln_tensor_numel(data), is_word(p, init, "ones") ? 1.0f : 0.0f);
    return true;
}

/* file '(' STRING ')' */
static bool parse_file_init(Parser *p, const Type *ty, const char *wname, kiln_tensor *data) {
    if (!expect(p, "(", "expected '(' after file")) return false;
    const Token *path = peek(p);
    if (path->kind != T_STRING) return error_at(p, path, "expected a file name string");
    advance(p);
    return expect(p, ")", "expected ')' after the file name") &&
           load_file(p, path, wname, ty, data);
}

/* init := randn '(' INT ')' | zeros ['(' ')'] | ones ['(' ')'] | file '(' STRING ')'
 * data (an f32 tensor, data NULL) receives the values; the caller frees it. */
static bool parse_init(Parser *p, const Type *ty, const char *wname, kiln_tensor *data) {
    const Token *t = peek(p);
    if (t->kind != T_NAME)
        return error_at(p, t,
                        "expected an initializer: randn(seed), zeros, ones or file(\"path\")");
    advance(p);
    if (is_word(p, t, "randn")) return parse_randn(p, ty, t, data);
    if (is_word(p, t, "zeros") || is_word(p, t, "ones")) return parse_const_init(p, ty, t, data);
    if (is_word(p, t, "file")) return parse_file_init(p, ty, wname, data);
    return error_at(p, t,
                    "unknown initializer '%.*s': expected randn(seed), zeros, ones or "
                    "file(\"path\")",
                    t->len, p->src + t->pos);
}

/* ===== statements ======================================================== */

static bool define(Parser *p, const Token *name, kiln_value v) {
    return built(p, v, name) && sym_add(p, name, v);
}

/* 'input' NAME ':' type */
static bool parse_input(Parser *p) {
    const Token *name = NULL;
    Type ty;
    advance(p);
    if (!expect_name(p, "expected a name after 'input'", &name) || !check_new_name(p, name) ||
        !expect(p, ":", "expected ':' after the input name") || !parse_type(p, &ty))
        return false;
    char buf[LEX_MAX_NAME + 1];
    tok_name(p, name, buf);
    return define(p, name, kiln_input(p->g, buf, ty.dtype, ty.rank, ty.shape));
}

/* 'weight' NAME ':' type '=' init */
static bool parse_weight(Parser *p) {
    const Token *name = NULL;
    Type ty;
    advance(p);
    if (!expect_name(p, "expected a name after 'weight'", &name) || !check_new_name(p, name) ||
        !expect(p, ":", "expected ':' after the weight name") || !parse_type(p, &ty))
        return false;
    if (ty.dtype != KILN_F32)
        return error_at(p, ty.dtok, "weights must be f32, got %s", kiln_dtype_name(ty.dtype));
    if (!expect(p, "=", "expected '=' and an initializer after the weight type")) return false;
    char buf[LEX_MAX_NAME + 1];
    tok_name(p, name, buf);
    kiln_tensor data = {.dtype = KILN_F32};
    bool ok = parse_init(p, &ty, buf, &data);
    kiln_value v = ok ? kiln_weight(p->g, buf, ty.rank, ty.shape, data.data) : KILN_NONE;
    kiln_tensor_free(&data);
    return ok && define(p, name, v);
}

static bool is_output(const Parser *p, const char *name) {
    for (int i = 0; i < kiln_num_outputs(p->g); i++)
        if (strcmp(kiln_output_name(p->g, i), name) == 0) return true;
    return false;
}

/* 'output' NAME (',' NAME)* */
static bool parse_output(Parser *p) {
    const char *msg = "expected a name after 'output'";
    advance(p);
    do {
        const Token *name = NULL;
        kiln_value v = KILN_NONE;
        char buf[LEX_MAX_NAME + 1];
        if (!expect_name(p, msg, &name) || !lookup(p, name, &v)) return false;
        tok_name(p, name, buf);
        if (is_output(p, buf)) return error_at(p, name, "'%s' is already an output", buf);
        if (kiln_output(p->g, v, buf) != KILN_OK) return reposition(p, name);
        msg = "expected a name after ','";
    } while (accept(p, ","));
    return true;
}

/* NAME '=' expr */
static bool parse_assign(Parser *p) {
    const Token *name = advance(p);
    Value v;
    advance(p); /* '=' */
    return check_new_name(p, name) && parse_expr(p, &v) && to_tensor(p, &v) &&
           sym_add(p, name, v.t);
}

static bool end_of_statement(Parser *p) {
    const Token *t = peek(p);
    if (t->kind == T_EOF) return true;
    if (t->kind == T_NEWLINE) {
        advance(p);
        return true;
    }
    if (at_punct(p, ")") || at_punct(p, "]"))
        return error_at(p, t, "unmatched '%c'", p->src[t->pos]);
    return error_at(p, t, "expected end of line after the statement");
}

/* The keywords input/weight/output start a statement unless followed by '='
 * (a variable may be called "input", as in PyTorch code). */
static bool parse_statement(Parser *p) {
    const Token *t = peek(p), *next = peek2(p);
    if (t->kind != T_NAME) return error_at(p, t, "expected a statement");
    bool assign = tok_is(p, next, T_PUNCT, "=");
    bool ok;
    if (!assign && is_word(p, t, "input"))
        ok = parse_input(p);
    else if (!assign && is_word(p, t, "weight"))
        ok = parse_weight(p);
    else if (!assign && is_word(p, t, "output"))
        ok = parse_output(p);
    else if (assign)
        ok = parse_assign(p);
    else
        return error_at(p, next, "expected '=' after '%.*s'", t->len, p->src + t->pos);
    return ok && end_of_statement(p);
}

static bool parse_program(Parser *p) {
    int nstmts = 0;
    for (;;) {
        while (peek(p)->kind == T_NEWLINE) advance(p);
        if (peek(p)->kind == T_EOF) break;
        if (!parse_statement(p)) return false;
        nstmts++;
    }
    if (nstmts == 0) return error_at(p, peek(p), "empty program: no statements");
    if (kiln_num_outputs(p->g) == 0) return error_at(p, peek(p), "program has no output statement");
    return true;
}

/* ===== entry points ====================================================== */

static kiln_status parse_source(Graph *g, const char *src, size_t len, const char *filename) {
    Parser p = {.g = g, .src = src, .file = filename ? filename : "<string>"};
    if (len >= INT_MAX / 2)
        return graph_fail(g, KILN_ERR_INPUT, "%s: error: program too large", p.file), g->status;
    p.len = (int)len;
    p.lx = (Lexer){.src = src, .len = p.len};
    p.lexmsg = p.lx.lexmsg;
    if (!lex_run(&p.lx))
        nomem(&p);
    else {
        p.toks = p.lx.toks;
        p.ntoks = p.lx.ntoks;
        parse_program(&p);
    }
    kfree(p.lx.toks);
    kfree(p.syms);
    if (!p.failed) return KILN_OK;
    return g->status != KILN_OK ? g->status : KILN_ERR_INPUT;
}

kiln_status kiln_parse(kiln_graph *g, const char *src, const char *filename) {
    return parse_source(g, src ? src : "", src ? strlen(src) : 0, filename);
}

static kiln_status read_error(Graph *g, const char *path, kiln_status st, const char *why) {
    graph_fail(g, st, "cannot read %s: %s", path, why);
    return st;
}

/* Read a whole file into a kmalloc'd buffer. */
static kiln_status read_file(Graph *g, const char *path, char **out, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return read_error(g, path, KILN_ERR_INPUT, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = kmalloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        char *bigger = krealloc(buf, cap *= 2);
        if (!bigger) kfree(buf);
        buf = bigger;
    }
    int err = ferror(f) ? errno : 0;
    fclose(f);
    if (!buf) return read_error(g, path, KILN_ERR_NOMEM, "out of memory");
    if (err) {
        kfree(buf);
        return read_error(g, path, KILN_ERR_INPUT, strerror(err));
    }
    *out = buf;
    *len = n;
    return KILN_OK;
}

kiln_status kiln_parse_file(kiln_graph *g, const char *path) {
    char *src;
    size_t len;
    kiln_status st = read_file(g, path, &src, &len);
    if (st != KILN_OK) return st;
    st = parse_source(g, src, len, path);
    kfree(src);
    return st;
}
