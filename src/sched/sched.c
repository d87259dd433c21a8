/*
 * sched.c -- the fusion scheduler.   requires: a loop program; gives:
 * kernels in call order, the fusion log, traffic and peak memory.
 *
 * Following Inductor's scheduler (torch/_inductor/scheduler.py): one node
 * per computed buffer, op<N> computing buf<N>, each with its reads and
 * writes as dependencies (buffer, canonical index, sizes) and its group
 * (numel, rnumel). Fusion runs in rounds: collect candidate pairs (nodes that
 * touch a common buffer, within a proximity window of that buffer's users),
 * keep those `can_fuse` accepts, sort them by the bytes of shared data they
 * save (then closeness in program order), fuse greedily -- re-checking each
 * pair against the fused nodes it now belongs to -- and re-sort the nodes
 * topologically. A round that fuses nothing, or leaves one node, ends it.
 *
 * The policy is the table `fuse_rules`: each rule is a small function that
 * returns NULL or the reason it refuses, checked in order; the first refusal
 * is logged as `cannot fuse op1 with op3: <reason>`. The mechanics (groups,
 * orders, the memory planner, stages) are kept apart from the rules.
 *
 * Dependencies between fused nodes are those of the current group graph:
 * fusing two nodes joins their dependencies, so each fusion recomputes
 * every group's ancestors (a pair that was independent may no longer be).
 *
 * As in Inductor, a round only takes the pairs of the best priority class
 * present: fusions that share one loop body (priority 0) go before
 * "outer-loop" fusions that put a consumer in a later inner loop of a
 * reduction's row loop (priority 1; Inductor's CPU backend ranks its
 * OuterLoopFusedSchedulerNode the same way). This is what makes softmax fuse
 * exp into the sum first (round 1), then the amax and the div around it
 * (round 2), as the softmax seed experiment expects (docs/design.md, "The
 * seed experiments").
 *
 * A fused reduction node is one outer loop over the parallel dims holding a
 * sequence of stages: inner loops over the reduced dims, or per-row scalar
 * steps. A member goes to the earliest stage after every reduction it reads;
 * siblings and independent members share a stage.
 *
 * Extern epilogues (cfg->extern_epilogue, on by default): an extern node
 * may be node1 of a fusion when node2 is pointwise over exactly its output
 * space and reads its output (or that of an epilogue member it holds
 * already) with the write index; every other rule applies as usual, so a
 * chain of pointwise nodes joins one by one, a reduction or another extern
 * never does, and an extern is never node2. The fused node stays one
 * library call, named extern_kernels.mm (conv2d, bmm) in the call
 * sequence, whose epilogue members run on each output block the library
 * has just computed. The fusion log keeps node names (op1, the names
 * rejections, the JSON and sched_why_not use; two matmuls would both be
 * "extern_kernels.mm") and says which call the node joins:
 * `fusing op1 with op2 (epilogue of extern_kernels.mm)`. With the switch off
 * an extern is a wall ("node1 is extern"), as in Inductor.
 */
#include "sched/sched.h"
#include <stdlib.h>
#include <string.h>

/* ===== bitsets ================================================================ */

static bool bit_get(const uint64_t *b, int i) { return (b[i >> 6] >> (i & 63)) & 1; }
static void bit_set(uint64_t *b, int i) { b[i >> 6] |= (uint64_t)1 << (i & 63); }
static bool bits_meet(const uint64_t *a, const uint64_t *b, int words) {
    for (int i = 0; i < words; i++)
        if (a[i] & b[i]) return true;
    return false;
}

/* ===== the scheduler's working state ============================================== */

/* A set of nodes scheduled as one: a single node or a fused node. */
typedef struct {
    int n;
    int *m;           /* member nodes, ascending (program order) */
    uint64_t *mem;    /* members as a bitset */
    uint64_t *anc;    /* ancestors of the members, outside the group */
    const char *name; /* op0_op1_op2 */
    bool alive;
    int nstages; /* stages of its loop structure */
} Group;

/* The loop structure of a set of nodes fused together. */
typedef struct {
    bool red; /* has a reduction: outer loop over P, stages over R */
    int np, nr;
    int64_t P[KILN_MAX_RANK], R[KILN_MAX_RANK];
    int n;
    const int *m;
    int *stage;      /* per member */
    StageKind *kind; /* per stage */
    int nstages;
} Struct;

/* What the rules learn about a pair on the way (each rule fills its part). */
typedef struct {
    int64_t score; /* bytes of shared data */
    bool vertical; /* node2 reads a buffer node1 writes */
    bool related;  /* node1 is an ancestor of node2 */
    Struct st;     /* loop structure of the union */
    int priority;  /* 0: one loop body; 1: outer-loop fusion */
} PairInfo;

typedef struct {
    Schedule *s;
    const KilnConfig *cfg;
    Pool *pool; /* the schedule's */
    Pool tmp;   /* scratch for one pair's checks */
    Pool rtmp;  /* scratch for one round */
    int words;  /* bitset words */
    int **cons; /* per node: consumer nodes (one per read dep) */
    int *ncons;
    Group *groups;
    int ngroups, capgroups;
    int *owner; /* node -> group */
    int *cur;   /* alive groups in order */
    int ncur;
    int round;
    int64_t source_bytes; /* inputs and weights, live throughout (-1: not yet) */
    bool peak_valid;      /* peak holds the planned peak of cur */
    int64_t peak;
    jmp_buf jb;
} Sched;

static const SNode *node(const Sched *S, int i) { return &S->s->nodes[i]; }
static const Buffer *nbuf(const Sched *S, int i) { return S->s->prog->bufs[node(S, i)->buf]; }
static int producer(const Sched *S, int buf) { return S->s->node_of_buf[buf]; }

static bool sizes_eq(int na, const int64_t *a, int nb, const int64_t *b) {
    return na == nb && memcmp(a, b, sizeof(int64_t) * (size_t)na) == 0;
}

/* A write over sizes w matches a read over sizes r when w is a prefix of r:
 * the reader runs the writer's loops, possibly inside more loops. */
static bool sizes_prefix(const Dep *w, const Dep *r) {
    return w->nsizes <= r->nsizes &&
           memcmp(w->sizes, r->sizes, sizeof(int64_t) * (size_t)w->nsizes) == 0;
}

static const Dep *write_dep(const SNode *n) { return &n->deps[n->ndeps - 1]; }

static bool is_reduction(const SNode *n) { return n->body == BODY_REDUCTION; }
static bool is_extern(const SNode *n) { return n->body == BODY_EXTERN; }
static const char *extern_name(const Buffer *b);

/* ===== building the nodes: deps, groups, ancestors ===================================== */

typedef struct {
    Sched *S;
    SNode *n;
    int cap;
} DepCtx;

static int64_t dep_bytes(const Sched *S, int buf, const Index *ix, int nsizes,
                         const int64_t *sizes) {
    const Buffer *b = S->s->prog->bufs[buf];
    int64_t e = 1;
    uint32_t vs = ix_vars(ix);
    for (int v = 0; v < nsizes; v++)
        if (vs & ((uint32_t)1 << v)) e *= sizes[v];
    if (e > b->numel) e = b->numel;
    return e * loop_elsize(b->dtype);
}

static void add_dep(DepCtx *c, int buf, Index *ix, int nsizes, const int64_t *sizes, bool write) {
    Sched *S = c->S;
    SNode *n = c->n;
    const char *txt = ix_str(S->pool, ix);
    for (int i = 0; i < n->ndeps; i++) /* one dep per (buffer, index) */
        if (n->deps[i].buf == buf && n->deps[i].write == write && !strcmp(n->deps[i].ix, txt))
            return;
    n->deps = pool_grow(S->pool, n->deps, &c->cap, n->ndeps + 1, sizeof(Dep));
    Dep *d = &n->deps[n->ndeps++];
    d->buf = buf;
    d->index = ix;
    d->ix = txt;
    d->nsizes = nsizes;
    memcpy(d->sizes, sizes, sizeof(int64_t) * (size_t)nsizes);
    d->write = write;
    d->bytes = dep_bytes(S, buf, ix, nsizes, sizes);
}

static void read_load(const Expr *e, void *ud) {
    DepCtx *c = ud;
    int64_t sizes[KILN_MAX_RANK];
    memcpy(sizes, c->n->P, sizeof(int64_t) * (size_t)c->n->np);
    memcpy(sizes + c->n->np, c->n->R, sizeof(int64_t) * (size_t)c->n->nr);
    add_dep(c, e->buf, e->index, c->n->np + c->n->nr, sizes, false);
}

/* An extern reads each operand through its view: offset + sum stride*v; a
 * gather reads of its data only the rows its indices pick
 * (lower_gathered_rows), counted as that many rows of the view. */
static void extern_reads(DepCtx *c, const Buffer *b) {
    Pool *P = c->S->pool;
    for (int i = 0; i < b->nopnds; i++) {
        const BufView *v = &b->opnd[i];
        int64_t shape[KILN_MAX_RANK];
        memcpy(shape, v->shape, sizeof(int64_t) * (size_t)v->rank);
        if (b->ext_op == OP_GATHER && i == 0) {
            int64_t ax = b->attr[0];
            shape[ax] =
                lower_gathered_rows(shape[ax], util_numel(b->opnd[1].rank, b->opnd[1].shape));
        }
        Index *ix = ix_const(P, v->offset);
        for (int d = 0; d < v->rank; d++) ix = ix_add(P, ix, ix_mul(P, ix_var(P, d), v->stride[d]));
        add_dep(c, v->buf, ix_simplify(P, ix, v->rank, shape), v->rank, shape, false);
    }
}

/* The write: the contiguous index of the parallel dims, last in deps. */
static void write_self(DepCtx *c, const Buffer *b) {
    Pool *P = c->S->pool;
    Index *v[KILN_MAX_RANK];
    for (int d = 0; d < c->n->np; d++) v[d] = ix_var(P, d);
    Index *ix = ix_simplify(P, ix_contiguous(P, c->n->np, c->n->P, v), c->n->np, c->n->P);
    add_dep(c, b->id, ix, c->n->np, c->n->P, true);
}

static void init_loops(SNode *n, const Buffer *b) {
    if (b->body == BODY_EXTERN) { /* squeezed output dims */
        for (int d = 0; d < b->rank; d++)
            if (b->shape[d] != 1) n->P[n->np++] = b->shape[d];
    } else {
        n->np = b->np;
        memcpy(n->P, b->size, sizeof n->P);
        n->nr = b->body == BODY_REDUCTION ? b->nr : 0;
        memcpy(n->R, b->rsize, sizeof n->R);
    }
    n->numel = util_numel(n->np, n->P);
    n->rnumel = util_numel(n->nr, n->R);
}

static void build_node(Sched *S, int k, const Buffer *b) {
    SNode *n = &S->s->nodes[k];
    n->name = pool_printf(S->pool, "op%d", k);
    n->buf = b->id;
    n->body = b->body;
    init_loops(n, b);
    DepCtx c = {S, n, 0};
    if (b->expr) ex_loads(b->expr, read_load, &c);
    if (b->body == BODY_EXTERN) extern_reads(&c, b);
    write_self(&c, b);
    n->regs = b->expr ? ex_regs(b->expr) : b->body == BODY_RAND ? 2 : 0;
}

/* Consumers of each node: one entry per read dep it produces. */
static void build_cons(Sched *S) {
    Schedule *s = S->s;
    int nn = s->nnodes;
    S->cons = pool_alloc(S->pool, sizeof(int *) * (size_t)(nn + 1));
    S->ncons = pool_alloc(S->pool, sizeof(int) * (size_t)(nn + 1));
    int *cap = pool_alloc(S->pool, sizeof(int) * (size_t)(nn + 1));
    for (int k = 0; k < nn; k++)
        for (int i = 0; i < s->nodes[k].ndeps; i++) {
            int p = s->nodes[k].deps[i].write ? -1 : producer(S, s->nodes[k].deps[i].buf);
            if (p < 0 || p == k) continue;
            S->cons[p] = pool_grow(S->pool, S->cons[p], &cap[p], S->ncons[p] + 1, sizeof(int));
            S->cons[p][S->ncons[p]++] = k;
        }
}

/* Ancestors: node k's producers come before it, so one pass suffices. */
static void link_nodes(Sched *S) {
    Schedule *s = S->s;
    for (int k = 0; k < s->nnodes; k++) {
        SNode *n = &s->nodes[k];
        n->anc = pool_alloc(S->pool, sizeof(uint64_t) * (size_t)S->words);
        for (int i = 0; i < n->ndeps; i++) {
            int p = n->deps[i].write ? -1 : producer(S, n->deps[i].buf);
            if (p < 0 || p == k) continue;
            for (int w = 0; w < S->words; w++) n->anc[w] |= s->nodes[p].anc[w];
            bit_set(n->anc, p);
        }
    }
    build_cons(S);
}

static void build_nodes(Sched *S) {
    Schedule *s = S->s;
    const LoopProgram *p = s->prog;
    s->node_of_buf = pool_alloc(S->pool, sizeof(int) * (size_t)(p->nbufs + 1));
    s->nodes = pool_alloc(S->pool, sizeof(SNode) * (size_t)(p->ncomputed + 1));
    for (int i = 0; i < p->nbufs; i++) {
        s->node_of_buf[i] = buf_computed(p->bufs[i]) ? s->nnodes++ : -1;
    }
    S->words = (s->nnodes + 63) / 64 + 1;
    for (int i = 0; i < p->nbufs; i++)
        if (s->node_of_buf[i] >= 0) build_node(S, s->node_of_buf[i], p->bufs[i]);
    link_nodes(S);
}

/* ===== groups ======================================================================= */

static bool in_group(const Group *g, int node) { return bit_get(g->mem, node); }

static int struct_of(Sched *S, Pool *P, const int *m, int n, Struct *st, char *why, size_t wl);

static int new_group(Sched *S, const int *m, int n) {
    S->groups = pool_grow(S->pool, S->groups, &S->capgroups, S->ngroups + 1, sizeof(Group));
    Group *g = &S->groups[S->ngroups];
    g->n = n;
    g->m = pool_alloc(S->pool, sizeof(int) * (size_t)n);
    memcpy(g->m, m, sizeof(int) * (size_t)n);
    g->mem = pool_alloc(S->pool, sizeof(uint64_t) * (size_t)S->words);
    g->anc = pool_alloc(S->pool, sizeof(uint64_t) * (size_t)S->words);
    Str name;
    str_init(&name, S->pool);
    for (int i = 0; i < n; i++) {
        bit_set(g->mem, m[i]);
        for (int w = 0; w < S->words; w++) g->anc[w] |= node(S, m[i])->anc[w];
        str_putf(&name, "%s%s", i ? "_" : "", node(S, m[i])->name);
    }
    for (int w = 0; w < S->words; w++) g->anc[w] &= ~g->mem[w];
    g->name = str_get(&name);
    g->alive = true;
    Struct st;
    char why[8];
    g->nstages = 1;
    if (!is_extern(node(S, m[0])) && struct_of(S, &S->tmp, m, n, &st, why, sizeof why) == 0)
        g->nstages = st.nstages;
    pool_free(&S->tmp);
    for (int i = 0; i < n; i++) S->owner[m[i]] = S->ngroups;
    return S->ngroups++;
}

/* The members of a and b, merged in program order. */
static int *merged(Pool *P, const Group *a, const Group *b) {
    int *m = pool_alloc(P, sizeof(int) * (size_t)(a->n + b->n));
    int i = 0, j = 0, w = 0;
    while (i < a->n || j < b->n)
        m[w++] = (j >= b->n || (i < a->n && a->m[i] < b->m[j])) ? a->m[i++] : b->m[j++];
    return m;
}

/* ===== orders and the memory planner ==================================================== */

/* The group of a node, with group mb counted as ma (a hypothetical fusion;
 * -1, -1 for none). */
static int gid(const Sched *S, int node_index, int ma, int mb) {
    int g = S->owner[node_index];
    return g == mb ? ma : g;
}

/* Min-heap of groups keyed by their first member (program order preferred). */
typedef struct {
    int *h;
    int n;
    const Group *gs;
} Heap;

static int hkey(const Heap *H, int i) { return H->gs[H->h[i]].m[0]; }
static void heap_push(Heap *H, int g) {
    int i = H->n++;
    H->h[i] = g;
    while (i && hkey(H, (i - 1) / 2) > hkey(H, i)) {
        int p = (i - 1) / 2, t = H->h[p];
        H->h[p] = H->h[i];
        H->h[i] = t;
        i = p;
    }
}
static int heap_pop(Heap *H) {
    int top = H->h[0], i = 0;
    H->h[0] = H->h[--H->n];
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < H->n && hkey(H, l) < hkey(H, m)) m = l;
        if (r < H->n && hkey(H, r) < hkey(H, m)) m = r;
        if (m == i) return top;
        int t = H->h[m];
        H->h[m] = H->h[i];
        H->h[i] = t;
        i = m;
    }
}

/* After group g ran: its consumers lose an edge. */
static void release(Sched *S, const Group *G, int g, int *indeg, Heap *H) {
    for (int j = 0; j < G->n; j++)
        for (int i = 0; i < S->ncons[G->m[j]]; i++) {
            int cg = S->owner[S->cons[G->m[j]][i]];
            if (cg != g && --indeg[cg] == 0) heap_push(H, cg);
        }
}

/* Kahn's algorithm over the alive groups, preferring program order (the
 * group whose first member comes first); fills out[], returns the count. */
static int topo(Sched *S, Pool *P, int *out) {
    int *indeg = pool_alloc(P, sizeof(int) * (size_t)(S->ngroups + 1));
    Heap H = {pool_alloc(P, sizeof(int) * (size_t)(S->ngroups + 1)), 0, S->groups};
    for (int k = 0; k < S->s->nnodes; k++)
        for (int i = 0; i < S->ncons[k]; i++)
            if (S->owner[k] != S->owner[S->cons[k][i]]) indeg[S->owner[S->cons[k][i]]]++;
    for (int g = 0; g < S->ngroups; g++)
        if (S->groups[g].alive && !indeg[g]) heap_push(&H, g);
    int n = 0;
    while (H.n) {
        int g = heap_pop(&H);
        out[n++] = g;
        release(S, &S->groups[g], g, indeg, &H);
    }
    return n;
}

static bool buf_output(const Sched *S, int k) { return nbuf(S, k)->is_output; }

/* Liveness over an order: sources live throughout, outputs from their kernel
 * to the end, any other buffer stored by its kernel until its last reader
 * has run; a buffer only read inside its own kernel is never allocated.
 * Peak = the most bytes live at once (dead buffers' memory is reused). */
static int64_t order_peak(Sched *S, Pool *P, const int *order, int n, int ma, int mb) {
    const LoopProgram *p = S->s->prog;
    int *pos = pool_alloc(P, sizeof(int) * (size_t)(S->ngroups + 1));
    int64_t *delta = pool_alloc(P, sizeof(int64_t) * (size_t)(n + 2));
    for (int i = 0; i < n; i++) pos[order[i]] = i;
    if (S->source_bytes < 0) {
        S->source_bytes = 0;
        for (int b = 0; b < p->nbufs; b++)
            if (!buf_computed(p->bufs[b]))
                S->source_bytes += p->bufs[b]->numel * loop_elsize(p->bufs[b]->dtype);
    }
    int64_t base = S->source_bytes;
    for (int k = 0; k < S->s->nnodes; k++) {
        int g = gid(S, k, ma, mb), last = -1;
        for (int i = 0; i < S->ncons[k]; i++) {
            int cg = gid(S, S->cons[k][i], ma, mb);
            if (cg != g && pos[cg] > last) last = pos[cg];
        }
        if (buf_output(S, k)) last = n - 1;
        if (last < 0) continue;
        int64_t bytes = nbuf(S, k)->numel * loop_elsize(nbuf(S, k)->dtype);
        delta[pos[g]] += bytes;
        delta[last + 1] -= bytes;
    }
    int64_t live = 0, peak = 0;
    for (int i = 0; i < n; i++) {
        live += delta[i];
        if (live > peak) peak = live;
    }
    return base + peak;
}

/* The order after fusing ga and gb, built from the current order (a valid
 * topological order): the fused node takes the earlier one's place, the
 * later one's ancestors that sit between them move ahead of it (they cannot
 * depend on the earlier one, or the pair would not be horizontal), and
 * everything else keeps its place. Returns the length; ga stands for both. */
static int fused_order(Sched *S, int ga, int gb, int *out) {
    int ia = -1, ib = -1, n = 0;
    for (int i = 0; i < S->ncur; i++) {
        if (S->cur[i] == ga) ia = i;
        if (S->cur[i] == gb) ib = i;
    }
    int lo = ia < ib ? ia : ib, hi = ia < ib ? ib : ia;
    const Group *later = &S->groups[S->cur[hi]];
    for (int i = 0; i < lo; i++) out[n++] = S->cur[i];
    for (int i = lo + 1; i < hi; i++)
        if (bits_meet(later->anc, S->groups[S->cur[i]].mem, S->words)) out[n++] = S->cur[i];
    out[n++] = ga;
    for (int i = lo + 1; i < hi; i++)
        if (!bits_meet(later->anc, S->groups[S->cur[i]].mem, S->words)) out[n++] = S->cur[i];
    for (int i = hi + 1; i < S->ncur; i++) out[n++] = S->cur[i];
    return n;
}

/* Planned peak of the current order, cached until the next fusion. */
static int64_t current_peak(Sched *S, Pool *P) {
    if (S->peak_valid) return S->peak;
    S->peak = order_peak(S, P, S->cur, S->ncur, -1, -1);
    S->peak_valid = true;
    return S->peak;
}

static int64_t fused_peak(Sched *S, Pool *P, int ga, int gb) {
    int *order = pool_alloc(P, sizeof(int) * (size_t)(S->ncur + 1));
    int n = fused_order(S, ga, gb, order);
    return order_peak(S, P, order, n, ga, gb);
}

/* ===== loop structure and stages ========================================================= */

static int member_index(const int *m, int n, int node_index) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (m[mid] == node_index) return mid;
        if (m[mid] < node_index)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

static void fmt_sizes(char *b, size_t n, int k, const int64_t *v) {
    size_t w = (size_t)snprintf(b, n, "[");
    for (int i = 0; i < k && w < n; i++)
        w += (size_t)snprintf(b + w, n - w, "%s%lld", i ? ", " : "", (long long)v[i]);
    if (w < n) snprintf(b + w, n - w, "]");
}

static void fmt_loops(char *b, size_t n, const SNode *x) {
    char p[96], r[96];
    fmt_sizes(p, sizeof p, x->np, x->P);
    fmt_sizes(r, sizeof r, x->nr, x->R);
    if (is_reduction(x))
        snprintf(b, n, "reduction %s x %s", p, r);
    else
        snprintf(b, n, "pointwise %s", p);
}

static void mismatch(char *why, size_t wl, const SNode *a, const SNode *b) {
    char x[224], y[224];
    fmt_loops(x, sizeof x, a);
    fmt_loops(y, sizeof y, b);
    snprintf(why, wl, "loop structure mismatch: %s vs %s", x, y);
}

/* Which loops hold a set of nodes: one nest over the pointwise shape, or a
 * reduction's row loop, where each pointwise member must iterate the
 * parallel dims (a per-row step) or the parallel ++ reduced dims (inside an
 * inner loop). Returns 0, or -1 with the mismatch in why. */
static int struct_loops(Sched *S, const int *m, int n, Struct *st, char *why, size_t wl) {
    const SNode *ref = NULL;
    for (int i = 0; i < n && !ref; i++)
        if (is_reduction(node(S, m[i]))) ref = node(S, m[i]);
    st->red = ref != NULL;
    if (!ref) ref = node(S, m[0]);
    st->np = ref->np;
    st->nr = ref->nr;
    memcpy(st->P, ref->P, sizeof st->P);
    memcpy(st->R, ref->R, sizeof st->R);
    int64_t full[2 * KILN_MAX_RANK];
    memcpy(full, st->P, sizeof(int64_t) * (size_t)st->np);
    memcpy(full + st->np, st->R, sizeof(int64_t) * (size_t)st->nr);
    for (int i = 0; i < n; i++) {
        const SNode *x = node(S, m[i]);
        bool ok = is_reduction(x)
                      ? sizes_eq(x->np, x->P, st->np, st->P) && sizes_eq(x->nr, x->R, st->nr, st->R)
                      : sizes_eq(x->np, x->P, st->np + st->nr, full) ||
                            (st->red && sizes_eq(x->np, x->P, st->np, st->P));
        if (!ok) {
            mismatch(why, wl, ref, x);
            return -1;
        }
    }
    return 0;
}

static StageKind member_stage_kind(const Sched *S, const Struct *st, int nd) {
    const SNode *x = node(S, nd);
    if (st->red && st->nr > 0 && !is_reduction(x) && sizes_eq(x->np, x->P, st->np, st->P))
        return STAGE_ROW;
    return STAGE_INNER;
}

/* Stage of member i: the earliest stage of its kind after every in-group
 * reduction (or value of the other kind) it reads, at or after every
 * same-kind value it reads. */
static void place_member(Sched *S, Pool *P, Struct *st, int i, int *cap) {
    const SNode *x = node(S, st->m[i]);
    StageKind k = member_stage_kind(S, st, st->m[i]);
    int lo = 0;
    for (int d = 0; d < x->ndeps; d++) {
        int p = x->deps[d].write ? -1 : producer(S, x->deps[d].buf);
        int q = p < 0 ? -1 : member_index(st->m, i, p);
        if (q < 0) continue;
        bool later = is_reduction(node(S, p)) || st->kind[st->stage[q]] != k;
        int need = st->stage[q] + later;
        if (need > lo) lo = need;
    }
    int s = lo;
    while (s < st->nstages && st->kind[s] != k) s++;
    if (s == st->nstages) {
        st->kind = pool_grow(P, st->kind, cap, st->nstages + 1, sizeof(StageKind));
        st->kind[st->nstages++] = k;
    }
    st->stage[i] = s;
}

static int struct_of(Sched *S, Pool *P, const int *m, int n, Struct *st, char *why, size_t wl) {
    memset(st, 0, sizeof *st);
    st->m = m;
    st->n = n;
    if (struct_loops(S, m, n, st, why, wl) < 0) return -1;
    st->stage = pool_alloc(P, sizeof(int) * (size_t)n);
    int cap = 0;
    for (int i = 0; i < n; i++) place_member(S, P, st, i, &cap);
    return 0;
}

/* ===== register pressure ==================================================================== */

/* A global load used by several members of a stage stays in a register
 * from its first use to its last. */
typedef struct {
    int buf;
    const char *ix;
    int first, last;
} HeldLoad;

/* Values live at once in stage s: the accumulators of its reductions, the
 * per-row values it reads from earlier stages, and at each member the
 * registers its own expression needs (Sethi-Ullman) plus the values computed
 * or loaded earlier in the loop body that a later member still reads. */
static int stage_pressure(Sched *S, Pool *P, const Struct *st, int s) {
    int n = st->n, acc = 0, rowvals = 0, worst = 0, nl = 0, cap = 0;
    int *last = pool_alloc(P, sizeof(int) * (size_t)n);
    bool *row = pool_alloc(P, sizeof(bool) * (size_t)n);
    HeldLoad *ld = NULL;
    for (int i = 0; i < n; i++) last[i] = -1;
    for (int i = 0; i < n; i++) {
        if (st->stage[i] != s) continue;
        const SNode *x = node(S, st->m[i]);
        acc += is_reduction(x);
        for (int d = 0; d < x->ndeps; d++) {
            const Dep *dp = &x->deps[d];
            int p = dp->write ? -2 : producer(S, dp->buf);
            int q = p < 0 ? -1 : member_index(st->m, n, p);
            if (p == -2) continue;
            if (q >= 0 && st->stage[q] == s) {
                last[q] = i;
                continue;
            }
            if (q >= 0) {
                rowvals += !row[q];
                row[q] = true;
                continue;
            }
            int l = 0;
            while (l < nl && (ld[l].buf != dp->buf || strcmp(ld[l].ix, dp->ix))) l++;
            if (l == nl) {
                ld = pool_grow(P, ld, &cap, nl + 1, sizeof(HeldLoad));
                ld[nl++] = (HeldLoad){dp->buf, dp->ix, i, i};
            }
            ld[l].last = i;
        }
    }
    for (int i = 0; i < n; i++) {
        if (st->stage[i] != s) continue;
        int live = node(S, st->m[i])->regs;
        for (int j = 0; j < i; j++)
            live += st->stage[j] == s && !is_reduction(node(S, st->m[j])) && last[j] > i;
        for (int l = 0; l < nl; l++) live += ld[l].first < i && ld[l].last > i;
        if (live > worst) worst = live;
    }
    return acc + rowvals + worst;
}

static int pressure(Sched *S, Pool *P, const Struct *st) {
    int worst = 0;
    for (int s = 0; s < st->nstages; s++) {
        int p = stage_pressure(S, P, st, s);
        if (p > worst) worst = p;
    }
    return worst;
}

/* ===== shared data ============================================================================ */

/* Two deps address the same data: same buffer and index, and the same sizes
 * (or a write whose sizes prefix the read's: the reader runs the writer's
 * loops inside more loops, as a consumer of a row statistic does). */
static bool deps_match(const Dep *a, const Dep *b) {
    if (a->buf != b->buf || strcmp(a->ix, b->ix)) return false;
    if (sizes_eq(a->nsizes, a->sizes, b->nsizes, b->sizes)) return true;
    return (a->write && sizes_prefix(a, b)) || (b->write && sizes_prefix(b, a));
}

static bool already_counted(Sched *S, const Group *a, int mi, int di) {
    const Dep *d = &node(S, a->m[mi])->deps[di];
    for (int i = 0; i <= mi; i++) {
        const SNode *x = node(S, a->m[i]);
        for (int j = 0; j < (i == mi ? di : x->ndeps); j++)
            if (x->deps[j].buf == d->buf && !strcmp(x->deps[j].ix, d->ix)) return true;
    }
    return false;
}

/* Bytes of the distinct (buffer, index) data both groups touch. */
static int64_t shared_bytes(Sched *S, const Group *a, const Group *b) {
    int64_t total = 0;
    for (int i = 0; i < a->n; i++) {
        const SNode *x = node(S, a->m[i]);
        for (int d = 0; d < x->ndeps; d++) {
            bool hit = false;
            for (int j = 0; j < b->n && !hit; j++) {
                const SNode *y = node(S, b->m[j]);
                for (int e = 0; e < y->ndeps && !hit; e++)
                    hit = deps_match(&x->deps[d], &y->deps[e]);
            }
            if (hit && !already_counted(S, a, i, d)) total += x->deps[d].bytes;
        }
    }
    return total;
}

/* ===== the fusion rules, in the order can_fuse checks them ====================================
 * Each returns NULL (no objection) or its reason. Where they come from:
 * Scheduler.can_fuse / can_fuse_vertical and the backends' can_fuse_* in
 * torch/_inductor (scheduler.py, codegen/cpp.py, codegen/simd.py). */

typedef const char *(*FuseRule)(Sched *S, const Group *a, const Group *b, PairInfo *pi);

/* An extern epilogue: node2 is pointwise over exactly the extern's output
 * space and reads what node1 (the extern and the epilogue members it holds
 * already) writes; rule_vertical then checks it reads each element with its
 * write index. Such a member can run on each output block the library
 * hands back, while the block is in cache (see codegen.c). Every member
 * of node2 must come after the extern in program order (members keep that
 * order, and the kernel starts with the library call): a member that does
 * not depend on it and comes earlier (a sibling fused into node2 before)
 * would have to run first. */
static const char *epilogue_check(Sched *S, const Group *a, const Group *b) {
    const SNode *x = node(S, a->m[0]);
    if (nbuf(S, a->m[0])->ext_op == OP_CALL) return "a call of sub-programs has no epilogue";
    bool reads = false;
    for (int j = 0; j < b->n; j++) {
        const SNode *y = node(S, b->m[j]);
        if (y->body != BODY_POINTWISE && y->body != BODY_RAND)
            return "extern epilogue must be pointwise";
        const Buffer *yb = nbuf(S, b->m[j]);
        if (yb->dtype == KILN_F64 || (yb->expr && ex_has_f64(yb->expr, true)))
            return "extern epilogue must compute in f32";
        if (!sizes_eq(y->np, y->P, x->np, x->P))
            return "extern epilogue must iterate the extern's output";
        if (b->m[j] < a->m[0]) return "extern epilogue member comes before the extern";
        for (int d = 0; d < y->ndeps && !reads; d++) {
            int p = y->deps[d].write ? -1 : producer(S, y->deps[d].buf);
            reads = p >= 0 && in_group(a, p);
        }
    }
    return reads ? NULL : "extern epilogue must read the extern's output";
}

/* A library kernel has no loop to share (extern_kernels.mm is a wall),
 * except that with cfg->extern_epilogue pointwise consumers of its output
 * may join it as its epilogue. An extern is never node2: nothing runs
 * before the library inside its call. */
static const char *rule_extern(Sched *S, const Group *a, const Group *b, PairInfo *pi) {
    (void)pi;
    bool ea = is_extern(node(S, a->m[0])), eb = is_extern(node(S, b->m[0]));
    if (ea && !S->cfg->extern_epilogue) return "node1 is extern";
    if (eb) return "node2 is extern";
    return ea ? epilogue_check(S, a, b) : NULL;
}

/* node1 runs first: node2 must not feed it. */
static const char *rule_order(Sched *S, const Group *a, const Group *b, PairInfo *pi) {
    (void)pi;
    return bits_meet(b->mem, a->anc, S->words) ? "node1 must go before node2" : NULL;
}

/* One kernel runs on one device (all CPU so far; the rule stays). */
static const char *rule_device(Sched *S, const Group *a, const Group *b, PairInfo *pi) {
    (void)pi;
    return node(S, a->m[0])->device != node(S, b->m[0])->device ? "device mismatch" : NULL;
}

/* Fusion pays in memory traffic; a pair that shares no data saves nothing
 * (two reads of x in different layouts are not shared either). */
static const char *rule_shared_data(Sched *S, const Group *a, const Group *b, PairInfo *pi) {
    pi->score = shared_bytes(S, a, b);
    pi->related = bits_meet(a->mem, b->anc, S->words);
    pi->vertical = false;
    for (int j = 0; j < b->n && !pi->vertical; j++) {
        const SNode *y = node(S, b->m[j]);
        for (int d = 0; d < y->ndeps && !pi->vertical; d++)
            pi->vertical = !y->deps[d].write && producer(S, y->deps[d].buf) >= 0 &&
                           in_group(a, producer(S, y->deps[d].buf));
    }
    return pi->score > 0 ? NULL : "no shared data";
}

/* Bigger kernels compile slowly and spill (Inductor's max_fusion_size). */
static const char *rule_max_fusion(Sched *S, const Group *a, const Group *b, PairInfo *pi) {
    (void)pi;
    return a->n + b->n > S->cfg->max_fusion_size ? "exceeds max fusion" : NULL;
}

/* Producer -> consumer: the consumer must read each element where the
 * producer wrote it (same index formula), and nothing may run between them. */
static const char *rule_vertical(Sched *S, const Group *a, const Group *b, PairInfo *pi) {
    if (!pi->vertical) return NULL;
    for (int j = 0; j < b->n; j++) {
        const SNode *y = node(S, b->m[j]);
        for (int d = 0; d < y->ndeps; d++) {
            int p = y->deps[d].write ? -1 : producer(S, y->deps[d].buf);
            if (p < 0) continue;
            if (in_group(a, p)) {
                const Dep *w = write_dep(node(S, p));
                if (strcmp(w->ix, y->deps[d].ix) || !sizes_prefix(w, &y->deps[d]))
                    return "memory deps did not match";
            } else if (!in_group(b, p) && bits_meet(S->groups[S->owner[p]].anc, a->mem, S->words)) {
                return "intermediate nodes between node1 & node2";
            }
        }
    }
    return NULL;
}

/* Siblings: running node2 early (at node1) stretches the lifetimes of what
 * it writes and what runs between; refuse when the planned peak grows. */
static const char *rule_horizontal(Sched *S, const Group *a, const Group *b, PairInfo *pi) {
    if (pi->related) return NULL;
    int ia = (int)(a - S->groups), ib = (int)(b - S->groups);
    int64_t before = current_peak(S, &S->tmp);
    int64_t after = fused_peak(S, &S->tmp, ia, ib);
    if ((double)after > (double)before * (1.0 + S->cfg->peak_memory_slack))
        return "will increase peak memory";
    return NULL;
}

/* node2 depends on node1 through a node outside the pair: the fused node
 * would have to run both before and after it. */
static const char *rule_cycle(Sched *S, const Group *a, const Group *b, PairInfo *pi) {
    if (!pi->related) return NULL;
    for (int c = 0; c < S->s->nnodes; c++)
        if (bit_get(b->anc, c) && !in_group(a, c) &&
            bits_meet(S->groups[S->owner[c]].anc, a->mem, S->words))
            return "will create cycle";
    return NULL;
}

/* The backend's check: one loop nest (same group), a pointwise node inside a
 * reduction's loops, or a reduction's consumer sharing its row loop. A
 * whole-tensor reduction has no row loop to share: its consumers need the
 * complete result (the wall). */
static const char *rule_loops(Sched *S, const Group *a, const Group *b, PairInfo *pi) {
    int *m = merged(&S->tmp, a, b);
    if (struct_of(S, &S->tmp, m, a->n + b->n, &pi->st, S->s->why, sizeof S->s->why) < 0)
        return S->s->why;
    int inner = 0;
    for (int s = 0; s < pi->st.nstages; s++) inner += pi->st.kind[s] == STAGE_INNER;
    if (pi->st.red && pi->st.np == 0 && inner > 1)
        return "whole-tensor reduction: consumer needs the complete result";
    int most = a->nstages > b->nstages ? a->nstages : b->nstages;
    pi->priority = pi->st.nstages > most;
    return NULL;
}

/* More live values than vector registers spill, and the spills cost the
 * traffic the fusion saved. */
static const char *rule_registers(Sched *S, const Group *a, const Group *b, PairInfo *pi) {
    (void)a;
    (void)b;
    int live = pressure(S, &S->tmp, &pi->st);
    if (live <= S->cfg->vector_registers) return NULL;
    snprintf(S->s->why, sizeof S->s->why, "register pressure: %d live values > budget %d", live,
             S->cfg->vector_registers);
    return S->s->why;
}

static const FuseRule fuse_rules[] = {
    rule_extern,   rule_order,      rule_device, rule_shared_data, rule_max_fusion,
    rule_vertical, rule_horizontal, rule_cycle,  rule_loops,       rule_registers,
};

static const char *can_fuse(Sched *S, int ga, int gb, PairInfo *pi) {
    memset(pi, 0, sizeof *pi);
    const Group *a = &S->groups[ga], *b = &S->groups[gb];
    for (size_t i = 0; i < sizeof fuse_rules / sizeof *fuse_rules; i++) {
        const char *why = fuse_rules[i](S, a, b, pi);
        if (why) return why;
    }
    return NULL;
}

/* ===== the fusion log ================================================================= */

static const char *reason_copy(Sched *S, const char *r) {
    return r == S->s->why ? pool_strdup(S->pool, r) : r;
}

void sched_print_event(FILE *f, const Schedule *s, const Event *e) {
    int R = s->cfg.max_rounds;
    switch (e->kind) {
    case EV_ROUND:
        fprintf(f, "===== attempting fusion (%d/%d): %d nodes =====\n", e->round, R, e->n0);
        break;
    case EV_REJECT: fprintf(f, "cannot fuse %s with %s: %s\n", e->a, e->b, e->reason); break;
    case EV_DEFER: fprintf(f, "deferring %s with %s: %s\n", e->a, e->b, e->reason); break;
    case EV_FOUND: fprintf(f, "found %d possible fusions\n", e->n0); break;
    case EV_FUSE:
        if (e->reason)
            fprintf(f, "fusing %s with %s (%s)\n", e->a, e->b, e->reason);
        else
            fprintf(f, "fusing %s with %s\n", e->a, e->b);
        break;
    case EV_DONE:
        fprintf(f, "completed fusion round (%d/%d): fused %d nodes into %d nodes\n", e->round, R,
                e->n0, e->n1);
        break;
    }
}

/* reason: why a pair was rejected or deferred; for a fusion, a note after
 * the line ("epilogue of extern_kernels.mm"). */
static void emit(Sched *S, EventKind k, const char *a, const char *b, const char *reason, int n0,
                 int n1) {
    Schedule *s = S->s;
    s->events = pool_grow(S->pool, s->events, &s->capevents, s->nevents + 1, sizeof(Event));
    Event *e = &s->events[s->nevents++];
    e->kind = k;
    e->round = S->round;
    e->a = a;
    e->b = b;
    e->reason = reason ? reason_copy(S, reason) : NULL;
    e->n0 = n0;
    e->n1 = n1;
    if (S->cfg->logs & LOG_FUSION) sched_print_event(S->cfg->log ? S->cfg->log : stderr, s, e);
    if (k == EV_REJECT) {
        s->rejected =
            pool_grow(S->pool, s->rejected, &s->caprejected, s->nrejected + 1, sizeof(Rejection));
        Rejection *r = &s->rejected[s->nrejected++];
        r->node1 = a;
        r->node2 = b;
        r->reason = e->reason;
        r->round = S->round;
    }
}

/* ===== rounds ============================================================================ */

typedef struct {
    int a, b; /* groups at the start of the round */
    int64_t score;
    int dist, seq, priority;
} Cand;

static int cand_cmp(const void *x, const void *y) {
    const Cand *a = x, *b = y;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    if (a->dist != b->dist) return a->dist < b->dist ? -1 : 1;
    return a->seq - b->seq;
}

/* A set of (group, group) pairs: open addressing over 64-bit keys. */
typedef struct {
    uint64_t *k;
    size_t mask;
} PairSet;

static bool pairset_add(PairSet *ps, int a, int b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    size_t h = (size_t)(key * 0x9E3779B97F4A7C15ull) & ps->mask;
    while (ps->k[h] && ps->k[h] != key) h = (h + 1) & ps->mask;
    if (ps->k[h]) return false;
    ps->k[h] = key;
    return true;
}

/* Each buffer's users (groups, in order), and the buffers in order of first use. */
typedef struct {
    int **users;
    int *nu;
    int *first;
    int nfirst;
} Users;

static void buffer_users(Sched *S, Pool *P, Users *U) {
    int nb = S->s->prog->nbufs + 1;
    U->users = pool_alloc(P, sizeof(int *) * (size_t)nb);
    U->nu = pool_alloc(P, sizeof(int) * (size_t)nb);
    U->first = pool_alloc(P, sizeof(int) * (size_t)nb);
    int *cap = pool_alloc(P, sizeof(int) * (size_t)nb);
    U->nfirst = 0;
    for (int i = 0; i < S->ncur; i++) {
        const Group *g = &S->groups[S->cur[i]];
        for (int j = 0; j < g->n; j++) {
            const SNode *x = node(S, g->m[j]);
            for (int d = 0; d < x->ndeps; d++) {
                int b = x->deps[d].buf;
                if (U->nu[b] && U->users[b][U->nu[b] - 1] == S->cur[i]) continue;
                if (!U->nu[b]) U->first[U->nfirst++] = b;
                U->users[b] = pool_grow(P, U->users[b], &cap[b], U->nu[b] + 1, sizeof(int));
                U->users[b][U->nu[b]++] = S->cur[i];
            }
        }
    }
}

/* Pairs of groups that touch a common buffer, each buffer's users paired
 * within the proximity window; deduplicated, in discovery order. */
static int collect_pairs(Sched *S, Pool *P, int **out) {
    Users U;
    buffer_users(S, P, &U);
    int W = S->cfg->proximity_window;
    size_t bound = 16;
    for (int f = 0; f < U.nfirst; f++) bound += (size_t)U.nu[U.first[f]] * (size_t)W;
    size_t size = 16;
    while (size < 2 * bound && size < ((size_t)1 << 40)) size *= 2;
    PairSet ps = {pool_alloc(P, sizeof(uint64_t) * size), size - 1};
    int npairs = 0, capp = 0, *pairs = NULL;
    for (int f = 0; f < U.nfirst; f++) {
        int b = U.first[f], *u = U.users[b];
        for (int i = 0; i < U.nu[b]; i++)
            for (int j = i + 1; j < U.nu[b] && j <= i + W; j++) {
                if (!pairset_add(&ps, u[i], u[j])) continue;
                pairs = pool_grow(P, pairs, &capp, 2 * npairs + 2, sizeof(int));
                pairs[2 * npairs] = u[i];
                pairs[2 * npairs + 1] = u[j];
                npairs++;
            }
    }
    *out = pairs;
    return npairs;
}

/* Ancestors of each group over the current group graph: fusing two nodes
 * joins their dependencies, so a third node that read one of them now also
 * waits for the other's ancestors. cur is a topological order, so one pass
 * in it suffices (Inductor walks fused nodes for the same reason in
 * will_fusion_create_cycle). */
static void group_ancestry(Sched *S) {
    for (int i = 0; i < S->ncur; i++) {
        Group *G = &S->groups[S->cur[i]];
        memset(G->anc, 0, sizeof(uint64_t) * (size_t)S->words);
        for (int j = 0; j < G->n; j++) {
            const SNode *x = node(S, G->m[j]);
            for (int d = 0; d < x->ndeps; d++) {
                int p = x->deps[d].write ? -1 : producer(S, x->deps[d].buf);
                if (p < 0 || in_group(G, p)) continue;
                const Group *P = &S->groups[S->owner[p]];
                for (int w = 0; w < S->words; w++) G->anc[w] |= P->anc[w] | P->mem[w];
            }
        }
    }
}

static void fuse(Sched *S, int ga, int gb, Round *r) {
    Group *a = &S->groups[ga], *b = &S->groups[gb];
    const char *note = NULL; /* the log names the library call an epilogue joins */
    if (is_extern(node(S, a->m[0])))
        note = pool_printf(S->pool, "epilogue of %s", extern_name(nbuf(S, a->m[0])));
    emit(S, EV_FUSE, a->name, b->name, note, 0, 0);
    int cap = r->capfused;
    r->fused_a = pool_grow(S->pool, r->fused_a, &cap, r->nfused + 1, sizeof(char *));
    r->fused_b = pool_grow(S->pool, r->fused_b, &r->capfused, r->nfused + 1, sizeof(char *));
    r->fused_a[r->nfused] = a->name;
    r->fused_b[r->nfused] = b->name;
    r->nfused++;
    int n = a->n + b->n;
    int *m = merged(S->pool, a, b);
    int *order = pool_alloc(&S->rtmp, sizeof(int) * (size_t)(S->ncur + 1));
    S->ncur = fused_order(S, ga, gb, order);
    a->alive = b->alive = false;
    int g = new_group(S, m, n);
    for (int i = 0; i < S->ncur; i++) S->cur[i] = order[i] == ga ? g : order[i];
    S->peak_valid = false;
    pool_free(&S->tmp);
    group_ancestry(S);
}

/* Candidate pairs that can fuse, best priority class only, sorted (in P). */
static int possible_fusions(Sched *S, Pool *P, Cand **out) {
    int *pairs, npairs = collect_pairs(S, P, &pairs);
    int *pos = pool_alloc(P, sizeof(int) * (size_t)(S->ngroups + 1));
    for (int i = 0; i < S->ncur; i++) pos[S->cur[i]] = i;
    Cand *c = pool_alloc(P, sizeof(Cand) * (size_t)(npairs + 1));
    int n = 0, best = 1 << 30;
    for (int i = 0; i < npairs; i++) {
        int a = pairs[2 * i], b = pairs[2 * i + 1];
        PairInfo pi;
        const char *why = can_fuse(S, a, b, &pi);
        if (why) emit(S, EV_REJECT, S->groups[a].name, S->groups[b].name, why, 0, 0);
        pool_free(&S->tmp);
        if (why) continue;
        c[n] = (Cand){a, b, pi.score, pos[b] - pos[a], i, pi.priority};
        if (pi.priority < best) best = pi.priority;
        n++;
    }
    int w = 0;
    for (int i = 0; i < n; i++) {
        if (c[i].priority == best) {
            c[w++] = c[i];
            continue;
        }
        emit(S, EV_DEFER, S->groups[c[i].a].name, S->groups[c[i].b].name,
             "outer-loop fusion waits for same-loop fusions", 0, 0);
    }
    qsort(c, (size_t)w, sizeof(Cand), cand_cmp);
    *out = c;
    return w;
}

static void reorder(Sched *S) {
    int alive = 0;
    for (int g = 0; g < S->ngroups; g++) alive += S->groups[g].alive;
    S->ncur = topo(S, &S->tmp, S->cur);
    if (S->ncur != alive) abort(); /* a cycle among fused nodes: a bug in the rules */
    S->peak_valid = false;
    pool_free(&S->tmp);
}

static bool one_round(Sched *S, Round *r) {
    int before = S->ncur;
    r->nodes_before = before;
    emit(S, EV_ROUND, NULL, NULL, NULL, before, 0);
    Cand *c;
    int n = possible_fusions(S, &S->rtmp, &c);
    r->possible = n;
    emit(S, EV_FOUND, NULL, NULL, NULL, n, 0);
    for (int i = 0; i < n; i++) {
        int ga = S->owner[S->groups[c[i].a].m[0]], gb = S->owner[S->groups[c[i].b].m[0]];
        if (ga == gb) continue;
        PairInfo pi;
        const char *why = can_fuse(S, ga, gb, &pi);
        if (why) emit(S, EV_REJECT, S->groups[ga].name, S->groups[gb].name, why, 0, 0);
        pool_free(&S->tmp);
        if (!why) fuse(S, ga, gb, r);
    }
    pool_free(&S->rtmp);
    reorder(S);
    r->nodes_after = S->ncur;
    emit(S, EV_DONE, NULL, NULL, NULL, before, S->ncur);
    return S->ncur != before && S->ncur > 1;
}

static void run_rounds(Sched *S) {
    Schedule *s = S->s;
    s->rounds = pool_alloc(S->pool, sizeof(Round) * (size_t)(S->cfg->max_rounds + 1));
    for (S->round = 1; S->round <= S->cfg->max_rounds; S->round++) {
        bool more = one_round(S, &s->rounds[s->nrounds++]);
        if (!more) break;
    }
}

/* ===== kernels ============================================================================= */

static ExtView ext_view(const BufView *v) {
    ExtView e = {.rank = v->rank, .offset = v->offset};
    memcpy(e.shape, v->shape, sizeof(int64_t) * (size_t)v->rank);
    memcpy(e.stride, v->stride, sizeof(int64_t) * (size_t)v->rank);
    return e;
}

/* A batched matmul that the library runs as one GEMM (a shared weight,
 * ext_matmul_folds) is named mm, as what runs. */
static const char *extern_name(const Buffer *b) {
    if (b->ext_op == OP_CONV2D) return "extern_kernels.conv2d";
    if (b->ext_op == OP_GATHER) return "extern_kernels.gather";
    if (b->ext_op == OP_CONV_TRANSPOSE2D) return "extern_kernels.conv_transpose2d";
    if (b->ext_op == OP_CALL) return b->call->kind == CALL_IF ? "subprogram.if" : "subprogram.loop";
    if (b->rank <= 2) return "extern_kernels.mm";
    ExtView a = ext_view(&b->opnd[0]), w = ext_view(&b->opnd[1]);
    return b->dtype != KILN_F64 && ext_matmul_folds(&a, &w, b->rank, b->shape)
               ? "extern_kernels.mm"
               : "extern_kernels.bmm";
}

const char *sched_extern_path(const LoopProgram *p, const Buffer *b, char *buf, size_t n) {
    const char *path = NULL;
    if (b->ext_op == OP_CONV2D) {
        path = ext_conv_path(b->opnd[0].shape, b->opnd[1].shape, b->shape, b->attr);
    } else if (b->ext_op == OP_MATMUL && b->dtype == KILN_F64) {
        path = "OpenBLAS dgemm (f64, a call per batch)";
    } else if (b->ext_op == OP_MATMUL) {
        ExtView a = ext_view(&b->opnd[0]), w = ext_view(&b->opnd[1]);
        path = ext_matmul_path(&a, &w, b->rank, b->shape,
                               p->bufs[b->opnd[1].buf]->body == BODY_WEIGHT);
    } else if (b->ext_op == OP_CONV_TRANSPOSE2D) {
        path = ext_conv_transpose_path(b->opnd[0].shape, b->opnd[1].shape, b->shape, b->attr);
    } else if (b->ext_op == OP_CALL) {
        util_fmt(buf, n, "%s: compiled sub-program%s, called by the runtime",
                 b->call->label ? b->call->label : "call", b->call->kind == CALL_IF ? "s" : "");
        return buf;
    }
    if (!path) return NULL;
    util_fmt(buf, n, "%s, on %s", path, ext_path_isa(path));
    return buf;
}

/* Where each member's result lives: memory when an output or read by
 * another kernel, a register when only read in its own stage, else a
 * per-row local of the shared outer loop. */
static void set_stores(Sched *S, Kernel *k) {
    for (int i = 0; i < k->n; i++) {
        int nd = k->members[i];
        StoreKind st = STORE_REGISTER;
        for (int c = 0; c < S->ncons[nd]; c++) {
            int q = member_index(k->members, k->n, S->cons[nd][c]);
            if (q < 0) {
                st = STORE_GLOBAL;
                break;
            }
            if (k->stage[q] != k->stage[i]) st = STORE_ROW_LOCAL;
        }
        if (buf_output(S, nd) || S->ncons[nd] == 0) st = STORE_GLOBAL;
        k->store[i] = st;
    }
}

static void set_origins(Sched *S, Kernel *k) {
    Str name;
    str_init(&name, S->pool);
    const char **o = NULL;
    int n = 0, cap = 0;
    for (int i = 0; i < k->n; i++) {
        const Buffer *b = nbuf(S, k->members[i]);
        for (int j = 0; j < b->norigins; j++) {
            int at = 0;
            while (at < n && strcmp(o[at], b->origins[j]) < 0) at++;
            if (at < n && !strcmp(o[at], b->origins[j])) continue;
            o = pool_grow(S->pool, o, &cap, n + 1, sizeof(char *));
            memmove(o + at + 1, o + at, sizeof(char *) * (size_t)(n - at));
            o[at] = b->origins[j];
            n++;
        }
    }
    k->origins = o;
    k->norigins = n;
}

static void kernel_traffic(Sched *S, Kernel *k) {
    for (int i = 0; i < k->n; i++) {
        const SNode *x = node(S, k->members[i]);
        for (int d = 0; d < x->ndeps; d++) {
            const Dep *dp = &x->deps[d];
            int p = producer(S, dp->buf);
            if (dp->write || (p >= 0 && member_index(k->members, k->n, p) >= 0)) continue;
            bool dup = false; /* each distinct (buffer, index) loads once */
            for (int j = 0; j <= i && !dup; j++) {
                const SNode *y = node(S, k->members[j]);
                for (int e = 0; e < (j == i ? d : y->ndeps) && !dup; e++)
                    dup = !y->deps[e].write && y->deps[e].buf == dp->buf &&
                          !strcmp(y->deps[e].ix, dp->ix);
            }
            if (!dup) k->load_bytes += dp->bytes;
        }
        if (k->store[i] == STORE_GLOBAL)
            k->store_bytes +=
                nbuf(S, k->members[i])->numel * loop_elsize(nbuf(S, k->members[i])->dtype);
    }
}

static void build_kernel(Sched *S, Kernel *k, const Group *g, int *counter) {
    memset(k, 0, sizeof *k);
    k->name = g->name;
    k->n = g->n;
    k->members = g->m;
    k->stage = pool_alloc(S->pool, sizeof(int) * (size_t)g->n);
    k->store = pool_alloc(S->pool, sizeof(StoreKind) * (size_t)g->n);
    const SNode *first = node(S, g->m[0]);
    set_origins(S, k);
    if (is_extern(first)) {
        k->kind = KK_EXTERN;
        k->kernel = extern_name(nbuf(S, g->m[0]));
        k->np = first->np;
        memcpy(k->P, first->P, sizeof k->P);
    } else {
        Struct st;
        char why[256];
        if (struct_of(S, S->pool, g->m, g->n, &st, why, sizeof why) < 0) abort(); /* fused: valid */
        k->kind = st.red ? KK_REDUCTION : KK_POINTWISE;
        k->np = st.np;
        k->nr = st.nr;
        memcpy(k->P, st.P, sizeof k->P);
        memcpy(k->R, st.R, sizeof k->R);
        memcpy(k->stage, st.stage, sizeof(int) * (size_t)g->n);
        k->nstages = st.nstages;
        k->stage_kind = pool_alloc(S->pool, sizeof(StageKind) * (size_t)(st.nstages + 1));
        memcpy(k->stage_kind, st.kind, sizeof(StageKind) * (size_t)st.nstages);
        k->loop_nests = 1;
        k->regs = pressure(S, &S->tmp, &st);
        Str name;
        str_init(&name, S->pool);
        str_putf(&name, "cpp_fused");
        for (int i = 0; i < k->norigins; i++) str_putf(&name, "_%s", k->origins[i]);
        str_putf(&name, "_%d", (*counter)++);
        k->kernel = str_get(&name);
    }
    k->numel = util_numel(k->np, k->P);
    k->rnumel = util_numel(k->nr, k->R);
    set_stores(S, k);
    kernel_traffic(S, k);
}

static void build_kernels(Sched *S) {
    Schedule *s = S->s;
    s->kernels = pool_alloc(S->pool, sizeof(Kernel) * (size_t)(S->ncur + 1));
    int counter = 0;
    for (int i = 0; i < S->ncur; i++) {
        build_kernel(S, &s->kernels[i], &S->groups[S->cur[i]], &counter);
        pool_free(&S->tmp);
        s->fused_bytes += s->kernels[i].load_bytes + s->kernels[i].store_bytes;
    }
    s->nkernels = S->ncur;
    s->peak_bytes = sched_peak_memory(s);
    if (s->peak_bytes < 0) longjmp(S->jb, 1); /* its tables: out of memory */
}

/* ===== entry points =========================================================================== */

static void init_groups(Sched *S) {
    int nn = S->s->nnodes;
    S->owner = pool_alloc(S->pool, sizeof(int) * (size_t)(nn + 1));
    S->cur = pool_alloc(S->pool, sizeof(int) * (size_t)(nn + 1));
    for (int k = 0; k < nn; k++) {
        new_group(S, &k, 1);
        S->cur[S->ncur++] = k;
    }
}

static void print_final(Sched *S) {
    FILE *f = S->cfg->log ? S->cfg->log : stderr;
    for (int i = 0; i < S->s->nkernels; i++)
        fprintf(f, "kernel %s: %s (%s)\n", S->s->kernels[i].kernel, S->s->kernels[i].name,
                kernel_kind_name[S->s->kernels[i].kind]);
}

kiln_status sched_run(const LoopProgram *p, const KilnConfig *cfg, Schedule **out, char *err,
                      size_t errlen) {
    *out = NULL;
    Schedule *s = kcalloc(1, sizeof *s);
    if (!s) {
        if (errlen) snprintf(err, errlen, "out of memory");
        return KILN_ERR_NOMEM;
    }
    s->cfg = cfg ? *cfg : kiln_config_default();
    s->prog = p;
    s->g = p->g;
    s->unfused_bytes = p->unfused_bytes;
    Sched S = {.s = s, .cfg = &s->cfg, .pool = &s->pool, .source_bytes = -1};
    s->pool.oom = &S.jb;
    S.tmp.oom = &S.jb;
    S.rtmp.oom = &S.jb;
    if (setjmp(S.jb)) {
        pool_free(&S.tmp);
        pool_free(&S.rtmp);
        sched_free(s);
        if (errlen) snprintf(err, errlen, "out of memory");
        return KILN_ERR_NOMEM;
    }
    build_nodes(&S);
    if (S.cfg->logs & LOG_SCHEDULE) sched_print_nodes(S.cfg->log ? S.cfg->log : stderr, s);
    init_groups(&S);
    run_rounds(&S);
    build_kernels(&S);
    if (S.cfg->logs & LOG_SCHEDULE) print_final(&S);
    pool_free(&S.tmp);
    s->pool.oom = NULL;
    *out = s;
    return KILN_OK;
}

void sched_free(Schedule *s) {
    if (!s) return;
    pool_free(&s->pool);
    kfree(s);
}

int sched_node_index(const Schedule *s, const char *name) {
    for (int i = 0; i < s->nnodes; i++)
        if (!strcmp(s->nodes[i].name, name)) return i;
    return -1;
}

static const char *why_not_singletons(Sched *S, int a, int b) {
    build_cons(S);
    init_groups(S);
    PairInfo pi;
    return can_fuse(S, a, b, &pi); /* formatted reasons live in the schedule */
}

/* Rebuild the singleton state over a finished schedule and ask can_fuse
 * (kept out of line: setjmp and the caller's loops do not mix). */
static __attribute__((noinline)) const char *why_not_ids(Schedule *s, int a, int b) {
    Pool scratch = {{0}, NULL};
    Sched S = {.s = s, .cfg = &s->cfg, .pool = &scratch, .source_bytes = -1};
    S.words = (s->nnodes + 63) / 64 + 1;
    scratch.oom = S.tmp.oom = S.rtmp.oom = &S.jb;
    const char *volatile why = "out of memory";
    if (!setjmp(S.jb)) why = why_not_singletons(&S, a, b);
    pool_free(&S.tmp);
    pool_free(&scratch);
    return why;
}

const char *sched_why_not(Schedule *s, const char *an, const char *bn) {
    int a = sched_node_index(s, an), b = sched_node_index(s, bn);
    if (a < 0 || b < 0) return "no such node";
    return why_not_ids(s, a, b);
}

int64_t sched_peak_memory(const Schedule *s) {
    const LoopProgram *p = s->prog;
    int64_t base = 0, live = 0, peak = 0;
    for (int b = 0; b < p->nbufs; b++)
        if (!buf_computed(p->bufs[b])) base += p->bufs[b]->numel * loop_elsize(p->bufs[b]->dtype);
    int *kernel_of = kcalloc((size_t)s->nnodes + 1, sizeof(int));
    int64_t *delta = kcalloc((size_t)s->nkernels + 2, sizeof(int64_t));
    if (!kernel_of || !delta) {
        kfree(kernel_of);
        kfree(delta);
        return -1;
    }
    for (int k = 0; k < s->nkernels; k++)
        for (int i = 0; i < s->kernels[k].n; i++) kernel_of[s->kernels[k].members[i]] = k;
    for (int k = 0; k < s->nkernels; k++)
        for (int i = 0; i < s->kernels[k].n; i++) {
            int nd = s->kernels[k].members[i];
            if (s->kernels[k].store[i] != STORE_GLOBAL) continue;
            const Buffer *b = p->bufs[s->nodes[nd].buf];
            int last = b->is_output ? s->nkernels - 1 : k;
            for (int c = 0; c < s->nnodes; c++)
                for (int d = 0; d < s->nodes[c].ndeps; d++)
                    if (!s->nodes[c].deps[d].write && s->nodes[c].deps[d].buf == b->id &&
                        kernel_of[c] > last)
                        last = kernel_of[c];
            int64_t bytes = b->numel * loop_elsize(b->dtype);
            delta[k] += bytes;
            delta[last + 1] -= bytes;
        }
    for (int k = 0; k < s->nkernels; k++) {
        live += delta[k];
        if (live > peak) peak = live;
    }
    kfree(kernel_of);
    kfree(delta);
    return base + peak;
}

/* ===== printing nodes ========================================================================= */

const char *const kernel_kind_name[] = {"pointwise", "reduction", "extern"};
const char *const store_name[] = {"stored", "register", "row-local"};

void sched_print_nodes(FILE *f, const Schedule *s) {
    for (int i = 0; i < s->nnodes; i++) {
        const SNode *n = &s->nodes[i];
        const Buffer *b = s->prog->bufs[n->buf];
        if (n->body == BODY_EXTERN) {
            fprintf(f, "ExternKernelSchedulerNode(name='%s'), %s\n", n->name, extern_name(b));
            continue;
        }
        char sz[128];
        fmt_sizes(sz, sizeof sz, n->np, n->P);
        fprintf(f, "SchedulerNode(name='%s'), %s(['%s', ", n->name,
                n->body == BODY_REDUCTION ? "Reduction" : "Pointwise", sz);
        if (n->body == BODY_REDUCTION) fprintf(f, "'%s', ", rop_name[b->rop]);
        if (n->body == BODY_RAND) fprintf(f, "'rand', ");
        fprintf(f, "'origins=[");
        for (int j = 0; j < b->norigins; j++) fprintf(f, "%s%s", j ? ", " : "", b->origins[j]);
        fprintf(f, "]'])\n");
    }
}
