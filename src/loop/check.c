/*
 * check.c -- loop_check: the invariants lower.c guarantees of the loop IR,
 * verified between lowering and scheduling (as QBE's ssacheck verifies SSA
 * form between its passes). plan_build runs it on every program; it walks
 * each buffer and expression once, allocates nothing, and stops at the
 * first violation with a message naming the buffer ("loop IR check: buf3
 * loads buf7, which is computed later"). A failure is a bug in lowering (or
 * in a pass that rewrote the IR after it), caught before the scheduler and
 * codegen turn it into a wrong kernel or an out-of-bounds access.
 *
 * What lower.c guarantees, and so what is checked:
 *   - bufs[i]->id == i, and the computed buffers are named buf0, buf1, ...
 *     in program order, ncomputed of them (the scheduler's op<N> computes
 *     buf<N>);
 *   - a buffer is created after everything it reads: a value's function
 *     only loads buffers that exist when it is built (set_loaded), and an
 *     extern's operands are materialized before its own buffer
 *     (lower_extern), so every load and every extern operand names a buffer
 *     with a smaller id, never the buffer itself;
 *   - every index uses only the variables of the iteration space of the
 *     buffer whose body holds it: v0..v(np-1) for a pointwise body,
 *     v0..v(np+nr-1) (parallel, then reduced) for a reduction;
 *   - iteration sizes are >= 1 (graph.c refuses non-positive dims) and none
 *     is 1 (squeeze drops size-1 dims); their product is the numel;
 *   - each EX_OP is a pointwise op of ops.def with op_info's arity, each
 *     select has two branches and a bound, each load's dtype is its
 *     buffer's, each division and modulo is by a positive constant;
 *   - an extern is a KIND_EXTERN op with op_info's arity of operands (1 to
 *     3 when variable), each a strided view that stays inside its buffer;
 *   - the program's inputs are Input buffers, its outputs are flagged
 *     is_output, and each buffer's graph node maps back to it.
 */
#include "loop/loop.h"
#include <stdarg.h>
#include <string.h>

typedef struct {
    const LoopProgram *p;
    const Buffer *b; /* the buffer being checked; NULL for the program */
    int nvars;       /* loop variables of b's body */
    char *err;
    size_t errlen;
} Check;

/* "loop IR check: <buffer> <what>"; returns false for the caller to pass up. */
static bool fail(Check *C, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool fail(Check *C, const char *fmt, ...) {
    if (!C->errlen) return false;
    const char *name = C->b ? (C->b->name ? C->b->name : "?") : NULL;
    util_fmt(C->err, C->errlen, "loop IR check: %s%s", name ? name : "", name ? " " : "");
    va_list ap;
    va_start(ap, fmt);
    util_vappend(C->err, C->errlen, fmt, ap);
    va_end(ap);
    return false;
}

static bool dtype_ok(kiln_dtype dt) { return dt >= KILN_F32 && dt <= KILN_BOOL; }

static const char *bname(const LoopProgram *p, int id) {
    return p->bufs[id]->name ? p->bufs[id]->name : "?";
}

/* A buffer the current one reads (a load or an extern operand): in range,
 * not itself, created before it. */
static bool check_read(Check *C, int buf, const char *verb) {
    const LoopProgram *p = C->p;
    if (buf < 0 || buf >= p->nbufs)
        return fail(C, "%s buffer id %d, outside the program's %d buffers", verb, buf, p->nbufs);
    if (buf == C->b->id) return fail(C, "%s itself", verb);
    if (buf > C->b->id)
        return fail(C, "%s %s, which is %s later", verb, bname(p, buf),
                    buf_computed(p->bufs[buf]) ? "computed" : "declared");
    return true;
}

/* An index over the body's loop variables; where says whose, as a verb
 * phrase ("reads buf2 at", "selects on"). */
static bool check_index(Check *C, const Index *ix, const char *where) {
    if (!ix) return fail(C, "%s no index", where);
    switch (ix->kind) {
    case IX_VAR: /* a variable of the body's iteration space */
        if (ix->v < 0 || ix->v >= C->nvars)
            return fail(C, "%s an index that uses v%lld, but its body has %d loop variables", where,
                        (long long)ix->v, C->nvars);
        return true;
    case IX_CONST: return true;
    case IX_ADD: /* a sum of at least one term */
        if (ix->n < 1) return fail(C, "%s an index with an empty sum", where);
        break;
    case IX_MUL:
        if (ix->n != 1) return fail(C, "%s an index with a product of %d operands", where, ix->n);
        break;
    case IX_FLOORDIV:
    case IX_MOD: /* one operand, by a positive constant */
        if (ix->n != 1 || ix->v <= 0)
            return fail(C, "%s an index with a %s by %lld of %d operands", where,
                        ix->kind == IX_MOD ? "modulo" : "division", (long long)ix->v, ix->n);
        break;
    default: return fail(C, "%s an index of unknown kind %d", where, (int)ix->kind);
    }
    for (int i = 0; i < ix->n; i++)
        if (!ix->a || !ix->a[i]) return fail(C, "%s an index with a missing operand", where);
    for (int i = 0; i < ix->n; i++)
        if (!check_index(C, ix->a[i], where)) return false;
    return true;
}

static bool check_expr(Check *C, const Expr *e) {
    const LoopProgram *p = C->p;
    char where[96];
    if (!e) return fail(C, "has a missing expression");
    if (!dtype_ok(e->dtype)) return fail(C, "has an expression of dtype %d", (int)e->dtype);
    switch (e->kind) {
    case EX_CONST: return true;
    case EX_LOAD: /* an earlier buffer, read as its dtype, at an index of the body */
        if (!check_read(C, e->buf, "loads")) return false;
        if (e->dtype != p->bufs[e->buf]->dtype)
            return fail(C, "loads %s as %s, but it holds %s", bname(p, e->buf),
                        kiln_dtype_name(e->dtype), kiln_dtype_name(p->bufs[e->buf]->dtype));
        snprintf(where, sizeof where, "reads %s at", bname(p, e->buf));
        return check_index(C, e->index, where);
    case EX_OP: /* a pointwise op of ops.def with its arity */
        if ((int)e->op < 0 || e->op >= OP_COUNT)
            return fail(C, "applies unknown op %d", (int)e->op);
        if (op_info[e->op].kind != KIND_POINTWISE)
            return fail(C, "applies %s, which is not a pointwise op", op_info[e->op].name);
        if (op_info[e->op].arity >= 0 && e->nargs != op_info[e->op].arity)
            return fail(C, "applies %s to %d operands; ops.def gives it %d", op_info[e->op].name,
                        e->nargs, op_info[e->op].arity);
        break;
    case EX_SELECT: /* two branches, a predicate index, at least one bound */
        if (e->nargs != 2) return fail(C, "has a select of %d branches", e->nargs);
        if (e->lo == EX_NOLO && e->hi == EX_NOHI)
            return fail(C, "has a select with no bound (it should have been folded)");
        if (e->lo != EX_NOLO && e->hi != EX_NOHI && e->lo >= e->hi)
            return fail(C, "has a select whose range [%lld, %lld) is empty", (long long)e->lo,
                        (long long)e->hi);
        if (!check_index(C, e->index, "selects on")) return false;
        break;
    default: return fail(C, "has an expression of unknown kind %d", (int)e->kind);
    }
    if (e->nargs > 0 && !e->args) return fail(C, "has an expression with no operands");
    for (int i = 0; i < e->nargs; i++)
        if (!check_expr(C, e->args[i])) return false;
    return true;
}

/* Iteration sizes: each >= 1, none 1 (squeezed away); what says which. */
static bool check_sizes(Check *C, int n, const int64_t *size, int first, const char *what) {
    if (n < 0 || n > KILN_MAX_RANK) return fail(C, "has %d %s sizes", n, what);
    for (int i = 0; i < n; i++) {
        if (size[i] < 1)
            return fail(C, "has range %lld for v%d (%s); ranges must be >= 1", (long long)size[i],
                        first + i, what);
        if (size[i] == 1)
            return fail(C, "has range 1 for v%d (%s); size-1 dims are dropped", first + i, what);
    }
    return true;
}

/* An extern operand: an earlier buffer, viewed inside its bounds. */
static bool check_view(Check *C, int i, const BufView *v) {
    if (!check_read(C, v->buf, "has extern operand")) return false;
    const Buffer *src = C->p->bufs[v->buf];
    if (v->rank < 0 || v->rank > KILN_MAX_RANK)
        return fail(C, "has extern operand %d of rank %d", i, v->rank);
    int64_t lo = v->offset, hi = v->offset, span;
    for (int d = 0; d < v->rank; d++) {
        if (v->shape[d] < 1)
            return fail(C, "has extern operand %d with dim %d of size %lld", i, d,
                        (long long)v->shape[d]);
        if (__builtin_mul_overflow(v->shape[d] - 1, v->stride[d], &span) ||
            __builtin_add_overflow(span < 0 ? lo : hi, span, span < 0 ? &lo : &hi))
            return fail(C, "has extern operand %d whose addresses overflow", i);
    }
    if (lo < 0 || hi >= src->numel)
        return fail(C, "reads %s at [%lld, %lld] as extern operand %d, outside its %lld elements",
                    bname(C->p, v->buf), (long long)lo, (long long)hi, i, (long long)src->numel);
    return true;
}

static bool check_body(Check *C, const Buffer *b) {
    switch (b->body) {
    case BODY_INPUT:
    case BODY_WEIGHT: /* no body; a weight has its data */
        if (b->expr) return fail(C, "is a source with a loop body");
        if (b->body == BODY_WEIGHT && !b->data) return fail(C, "is a weight with no data");
        return true;
    case BODY_POINTWISE:
    case BODY_RAND:
    case BODY_REDUCTION: { /* the parallel sizes cover the buffer */
        if (!check_sizes(C, b->np, b->size, 0, "parallel")) return false;
        int64_t n = util_numel(b->np, b->size);
        if (n != b->numel)
            return fail(C, "iterates %lld elements but holds %lld", (long long)n,
                        (long long)b->numel);
        C->nvars = b->np;
        if (b->body == BODY_REDUCTION) {
            if (!check_sizes(C, b->nr, b->rsize, b->np, "reduced")) return false;
            if (b->np + b->nr > KILN_MAX_RANK)
                return fail(C, "has %d + %d loop variables", b->np, b->nr);
            if ((int)b->rop < ROP_SUM || b->rop > ROP_PROD)
                return fail(C, "has unknown reduction %d", (int)b->rop);
            C->nvars = b->np + b->nr;
        }
        if (b->body == BODY_RAND) return b->expr ? fail(C, "is random with a loop body") : true;
        if (!b->expr) return fail(C, "has no loop body");
        return check_expr(C, b->expr);
    }
    case BODY_EXTERN: { /* a library op with its operands */
        if (b->expr) return fail(C, "is an extern with a loop body");
        if ((int)b->ext_op < 0 || b->ext_op >= OP_COUNT || op_info[b->ext_op].kind != KIND_EXTERN)
            return fail(C, "is an extern of op %d, which is not an extern op", (int)b->ext_op);
        int ar = op_info[b->ext_op].arity;
        if (ar >= 0 ? b->nopnds != ar : b->nopnds < 1 || b->nopnds > 3)
            return fail(C, "calls %s with %d operands", op_info[b->ext_op].name, b->nopnds);
        if (b->nattr < 0 || b->nattr > MAX_ATTR) return fail(C, "has %d attributes", b->nattr);
        for (int i = 0; i < b->nopnds; i++)
            if (!check_view(C, i, &b->opnd[i])) return false;
        return true;
    }
    }
    return fail(C, "has unknown body kind %d", (int)b->body);
}

static bool check_buffer(Check *C, int i, int *ncomputed) {
    const LoopProgram *p = C->p;
    const Buffer *b = p->bufs[i];
    C->b = NULL;
    if (!b) return fail(C, "buffer %d is missing", i);
    if (b->id != i) return fail(C, "buffer %d has id %d", i, b->id);
    C->b = b;
    if (!b->name) return fail(C, "(buffer %d) has no name", i);
    if (buf_computed(b)) { /* buf<k> for the k-th computed buffer */
        char want[32];
        snprintf(want, sizeof want, "buf%d", *ncomputed);
        if (strcmp(b->name, want))
            return fail(C, "is computed buffer %d; it should be named %s", *ncomputed, want);
        (*ncomputed)++;
    }
    if (!dtype_ok(b->dtype)) return fail(C, "has dtype %d", (int)b->dtype);
    if (b->rank < 0 || b->rank > KILN_MAX_RANK) return fail(C, "has rank %d", b->rank);
    /* Only an input or weight may be empty (decompose.c drops every node
     * that computes nothing): nothing reads it. */
    for (int d = 0; d < b->rank; d++)
        if (b->shape[d] < (buf_computed(b) ? 1 : 0))
            return fail(C, "has dim %d of size %lld", d, (long long)b->shape[d]);
    if (util_numel(b->rank, b->shape) != b->numel)
        return fail(C, "has numel %lld for its shape of %lld elements", (long long)b->numel,
                    (long long)util_numel(b->rank, b->shape));
    if (b->node < 0 || b->node >= p->g->n || p->node_buf[b->node] != i)
        return fail(C, "holds graph node %d, which does not map back to it", b->node);
    for (int k = 0; k < b->ncover; k++) /* ascending graph node ids */
        if (b->cover[k] < 0 || b->cover[k] >= p->g->n || (k && b->cover[k] <= b->cover[k - 1]))
            return fail(C, "covers graph node %d out of order or range", b->cover[k]);
    return check_body(C, b);
}

static bool check_program(Check *C) {
    const LoopProgram *p = C->p;
    if (!p->g) return fail(C, "program has no graph");
    if (p->nbufs < 0 || (p->nbufs > 0 && !p->bufs))
        return fail(C, "program has %d buffers", p->nbufs);
    int ncomputed = 0;
    for (int i = 0; i < p->nbufs; i++)
        if (!check_buffer(C, i, &ncomputed)) return false;
    C->b = NULL;
    if (ncomputed != p->ncomputed) /* the scheduler makes one node per computed buffer */
        return fail(C, "program counts %d computed buffers but has %d", p->ncomputed, ncomputed);
    for (int i = 0; i < p->ninputs; i++) {
        int b = p->inputs[i];
        if (b < 0 || b >= p->nbufs || p->bufs[b]->body != BODY_INPUT)
            return fail(C, "program input %d is buffer id %d, not an input buffer", i, b);
    }
    for (int i = 0; i < p->noutputs; i++) {
        int b = p->outputs[i];
        if (b < 0 || b >= p->nbufs)
            return fail(C, "program output %d is buffer id %d, outside the program", i, b);
        if (!p->bufs[b]->is_output)
            return fail(C, "program output %d is %s, which is not flagged is_output", i,
                        bname(p, b));
    }
    if (p->unfused_bytes < 0)
        return fail(C, "program has unfused traffic %lld", (long long)p->unfused_bytes);
    return true;
}

kiln_status loop_check(const LoopProgram *p, char *err, size_t errlen) {
    Check C = {.p = p, .err = err, .errlen = errlen};
    if (errlen) err[0] = 0;
    return check_program(&C) ? KILN_OK : KILN_ERR_INPUT;
}
