/*
 * lex.c -- the tokenizer of the .kiln text format, a hand-written one in
 * the manner of chibicc. It turns the whole source into an array of tokens
 * up front; newlines end statements, except inside () or [] where they are
 * skipped, so a call may span lines. A bad character does not stop it
 * with an error of its own: it ends the array with a T_ERROR token and
 * leaves the message in lexmsg, which the parser reports when it reaches
 * that token, so errors come out in source order. Numbers are converted
 * here (is_int, ival, num), in the C locale.
 */
#include "front/front.h"
#include <errno.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ===== tokenizer ========================================================= */

static bool is_alpha(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_digit(int c) { return c >= '0' && c <= '9'; }
static bool is_alnum(int c) { return is_alpha(c) || is_digit(c); }

/* The byte at i, or 0 past the end (sources need not be NUL-terminated). */
static int at_byte(const Lexer *p, int i) { return i < p->len ? (unsigned char)p->src[i] : 0; }

static Token *push(Lexer *p, TokKind kind, int pos, int len, int line, int col) {
    if (p->ntoks == p->cap) {
        int cap = p->cap ? 2 * p->cap : 256;
        Token *t = krealloc(p->toks, (size_t)cap * sizeof *t);
        if (!t) return NULL;
        p->toks = t;
        p->cap = cap;
    }
    Token *t = &p->toks[p->ntoks++];
    *t = (Token){.kind = kind, .pos = pos, .len = len, .line = line, .col = col};
    return t;
}

/* Length of the number at i; sets *is_int. 0 when the bytes after it make it
 * a bad literal ("1abc", "1.2.3", "0x10"). */
static int number_len(const Lexer *p, int i, bool *is_int) {
    int j = i;
    *is_int = true;
    while (is_digit(at_byte(p, j))) j++;
    if (at_byte(p, j) == '.') {
        *is_int = false;
        for (j++; is_digit(at_byte(p, j)); j++) {}
    }
    int e = j + 1;
    if ((at_byte(p, j) == 'e' || at_byte(p, j) == 'E')) {
        if (at_byte(p, e) == '+' || at_byte(p, e) == '-') e++;
        if (is_digit(at_byte(p, e))) {
            *is_int = false;
            for (j = e; is_digit(at_byte(p, j)); j++) {}
        }
    }
    return is_alnum(at_byte(p, j)) || at_byte(p, j) == '.' ? 0 : j - i;
}

/* strtod in the "C" locale: .kiln numbers use '.', whatever locale the
 * embedding program set (strtod follows LC_NUMERIC). */
static double c_strtod(char *buf) {
    const char *dp = localeconv()->decimal_point;
    char *dot = strchr(buf, '.');
    if (dot && dp[0] && !dp[1]) *dot = dp[0];
    double v = strtod(buf, NULL);
    if (dot) *dot = '.';
    return v;
}

/* Fill a number token's value; false (with p->lexmsg) on a bad literal. */
static bool number_value(Lexer *p, Token *t) {
    char buf[64];
    if (t->len >= (int)sizeof buf) {
        util_fmt(p->lexmsg, sizeof p->lexmsg, "number literal too long");
        return false;
    }
    memcpy(buf, p->src + t->pos, (size_t)t->len);
    buf[t->len] = '\0';
    t->num = c_strtod(buf);
    if (isinf(t->num)) {
        util_fmt(p->lexmsg, sizeof p->lexmsg, "number '%s' is out of range", buf);
        return false;
    }
    if (!t->is_int) return true;
    errno = 0;
    t->ival = strtoll(buf, NULL, 10);
    if (errno == ERANGE) {
        util_fmt(p->lexmsg, sizeof p->lexmsg, "integer literal '%s' is too large", buf);
        return false;
    }
    return true;
}

/* Length of the string literal at i (quotes included), 0 if unterminated. */
static int string_len(const Lexer *p, int i) {
    int q = at_byte(p, i), j = i + 1;
    while (j < p->len && at_byte(p, j) != q && at_byte(p, j) != '\n')
        j += at_byte(p, j) == '\\' && at_byte(p, j + 1) != '\n' && j + 1 < p->len ? 2 : 1;
    return at_byte(p, j) == q && j < p->len ? j + 1 - i : 0;
}

static int punct_len(const Lexer *p, int i) {
    static const char *const two[] = {"==", "!=", "<=", ">="};
    for (size_t k = 0; k < sizeof two / sizeof two[0]; k++)
        if (i + 1 < p->len && !memcmp(p->src + i, two[k], 2)) return 2;
    int c = at_byte(p, i);
    return c && strchr("()[],:=+-*/@<>", c) ? 1 : 0;
}

static void bad_char_message(Lexer *p, int c) {
    if (c > ' ' && c < 127)
        util_fmt(p->lexmsg, sizeof p->lexmsg, "unexpected character '%c'", c);
    else
        util_fmt(p->lexmsg, sizeof p->lexmsg, "unexpected character '\\x%02x'", c);
}

/* Scan one token at i (not a blank, comment or newline). Returns its kind
 * and length; T_ERROR with p->lexmsg set for a bad one. */
static TokKind scan(Lexer *p, int i, int *len, bool *is_int) {
    int c = at_byte(p, i);
    if (is_alpha(c)) {
        for (*len = 1; is_alnum(at_byte(p, i + *len)); (*len)++) {}
        if (*len <= LEX_MAX_NAME) return T_NAME;
        util_fmt(p->lexmsg, sizeof p->lexmsg, "name too long (at most %d characters)",
                 LEX_MAX_NAME);
        return T_ERROR;
    }
    if (is_digit(c) || (c == '.' && is_digit(at_byte(p, i + 1)))) {
        if ((*len = number_len(p, i, is_int)) > 0) return T_NUMBER;
        int j = i;
        while (is_alnum(at_byte(p, j)) || at_byte(p, j) == '.') j++;
        util_fmt(p->lexmsg, sizeof p->lexmsg, "invalid number '%.*s'", j - i, p->src + i);
        return T_ERROR;
    }
    if (c == '"' || c == '\'') {
        if ((*len = string_len(p, i)) > 0) return T_STRING;
        util_fmt(p->lexmsg, sizeof p->lexmsg, "unterminated string");
        return T_ERROR;
    }
    if ((*len = punct_len(p, i)) > 0) return T_PUNCT;
    bad_char_message(p, c);
    return T_ERROR;
}

/* Where the end of the input is reported: just after the last real token. */
static bool push_eof(Lexer *p) {
    int k = p->ntoks - 1;
    while (k >= 0 && p->toks[k].kind == T_NEWLINE) k--;
    if (k < 0) return push(p, T_EOF, 0, 0, 1, 1) != NULL;
    Token last = p->toks[k];
    return push(p, T_EOF, last.pos + last.len, 0, last.line, last.col + last.len) != NULL;
}

/* The tokenizer's place in the source. */
typedef struct {
    int i;         /* the next byte */
    int line, bol; /* the current line and the offset where it begins */
    int depth;     /* () [] nesting: newlines inside do not end a statement */
    int comment;   /* where a comment on this line starts, or -1 */
} Cursor;

static void track_depth(const Lexer *p, const Token *t, int *depth) {
    if (t->kind != T_PUNCT) return;
    char c = p->src[t->pos];
    if (c == '(' || c == '[')
        (*depth)++;
    else if ((c == ')' || c == ']') && *depth > 0)
        (*depth)--;
}

/* A newline ends a statement outside () and []. Its token sits at the
 * comment before it, if any, so "expected expression" points there. */
static bool newline(Lexer *p, Cursor *c) {
    int at = c->comment >= 0 ? c->comment : c->i;
    if (c->depth == 0 && !push(p, T_NEWLINE, at, 1, c->line, at - c->bol + 1)) return false;
    c->line++;
    c->bol = ++c->i;
    c->comment = -1;
    return true;
}

/* Skip blanks, comments and newlines (pushing T_NEWLINE tokens). */
static bool skip_space(Lexer *p, Cursor *c) {
    while (c->i < p->len) {
        int ch = at_byte(p, c->i);
        if (ch == '#') {
            c->comment = c->i;
            while (c->i < p->len && p->src[c->i] != '\n') c->i++;
        } else if (ch == '\n') {
            if (!newline(p, c)) return false;
        } else if (ch == ' ' || ch == '\t' || ch == '\r') {
            c->i++;
        } else {
            break;
        }
    }
    return true;
}

bool lex_run(Lexer *p) {
    Cursor c = {.line = 1, .comment = -1};
    for (;;) {
        if (!skip_space(p, &c)) return false;
        if (c.i >= p->len) break;
        int len = 1;
        bool is_int = false;
        TokKind kind = scan(p, c.i, &len, &is_int);
        Token *t = push(p, kind, c.i, len, c.line, c.i - c.bol + 1);
        if (!t) return false;
        t->is_int = is_int;
        if (kind == T_NUMBER && !number_value(p, t)) t->kind = kind = T_ERROR;
        if (kind == T_ERROR) break;
        track_depth(p, t, &c.depth);
        c.i += len;
    }
    return push_eof(p);
}
