/*
 * check.c -- sched_check: the invariants sched.c guarantees of a schedule,
 * verified after scheduling and before codegen (as QBE's ssacheck verifies
 * SSA form between its passes). plan_build runs it on every program; it
 * walks each node, dependency, kernel, round and event once, with one
 * table of two ints per node, and stops at the first violation with a
 * message naming the node or kernel ("schedule check: kernel 1
 * (cpp_fused_add_0) reads buf2, which kernel 3 (cpp_fused_sin_1) produces
 * later"). A failure is a bug in the scheduler, caught before codegen runs
 * a kernel on data not yet computed or keeps in a register what another
 * kernel reads from memory.
 *
 * What sched.c guarantees, and so what is checked:
 *   - one node per computed buffer (lowering already inlined the rest):
 *     node k is op<k>, computes buf<k>, node_of_buf maps that buffer to k
 *     and every source buffer to -1;
 *   - each node's deps end with its one write, of its own buffer; it reads
 *     sources or buffers of earlier nodes only;
 *   - every node is a member of exactly one kernel; members ascend (program
 *     order); no kernel of more than one member exceeds max_fusion_size;
 *   - kernels are in call order: a kernel reads only sources, its own
 *     members' results, and buffers of earlier kernels; what another kernel
 *     reads, and every output, is stored to memory (STORE_GLOBAL);
 *   - an extern kernel starts with its extern node, followed only by
 *     pointwise epilogue members over its output; no other kernel holds an
 *     extern; a kernel is a reduction kernel iff it holds a reduction;
 *   - each member iterates the kernel's loops (struct_loops' rule) and sits
 *     at a valid stage, at or after the stage of each member it reads,
 *     strictly after a reduction it reads;
 *   - traffic is non-negative, fused_bytes is the kernels' sum,
 *     unfused_bytes the loop program's, and the peak holds at least the
 *     sources. fused_bytes <= unfused_bytes is NOT an invariant: an extern
 *     operand that is not a strided view is copied first, which an eager
 *     framework never counts (test_check shows one);
 *   - rounds chain (each starts with the nodes the last left, fuses
 *     before - after pairs, the last leaves nkernels) and every event,
 *     fused pair and rejection names valid fused nodes ("op1_op3", members
 *     ascending) within the rounds that ran.
 */
#include "sched/sched.h"
#include <stdarg.h>
#include <string.h>

typedef struct {
    const Schedule *s;
    int *kernel_of; /* node -> kernel, -1 until seen */
    int *pos;       /* node -> its index among its kernel's members */
    char *err;
    size_t errlen;
} Check;

/* "schedule check: <what>"; returns false for the caller to pass up. */
static bool fail(Check *C, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool fail(Check *C, const char *fmt, ...) {
    if (!C->errlen) return false;
    util_fmt(C->err, C->errlen, "schedule check: ");
    va_list ap;
    va_start(ap, fmt);
    util_vappend(C->err, C->errlen, fmt, ap);
    va_end(ap);
    return false;
}

static const char *bname(const Schedule *s, int buf) {
    return s->prog->bufs[buf]->name ? s->prog->bufs[buf]->name : "?";
}

static const char *kname(const Kernel *k) { return k->kernel ? k->kernel : "?"; }

static bool sizes_eq(int na, const int64_t *a, int nb, const int64_t *b) {
    return na == nb && memcmp(a, b, sizeof(int64_t) * (size_t)na) == 0;
}

/* A fused node's name: op<N> joined by '_', N ascending and below nnodes. */
static bool group_name_ok(const char *name, int nnodes) {
    if (!name) return false;
    long last = -1;
    for (const char *c = name;; c++) {
        if (strncmp(c, "op", 2) != 0) return false;
        c += 2;
        long v = 0;
        if (*c < '0' || *c > '9') return false;
        while (*c >= '0' && *c <= '9' && v < nnodes) v = v * 10 + (*c++ - '0');
        if (v >= nnodes || v <= last) return false;
        last = v;
        if (*c == 0) return true;
        if (*c != '_') return false;
    }
}

static bool check_node(Check *C, int k) {
    const Schedule *s = C->s;
    const LoopProgram *p = s->prog;
    const SNode *n = &s->nodes[k];
    char want[32];
    snprintf(want, sizeof want, "op%d", k);
    if (!n->name || strcmp(n->name, want))
        return fail(C, "node %d is named %s", k, n->name ? n->name : "(null)");
    if (n->buf < 0 || n->buf >= p->nbufs || s->node_of_buf[n->buf] != k) /* op<k> <-> buf<k> */
        return fail(C, "%s computes buffer id %d, which does not map back to it", n->name, n->buf);
    snprintf(want, sizeof want, "buf%d", k);
    if (strcmp(bname(s, n->buf), want))
        return fail(C, "%s computes %s, not %s", n->name, bname(s, n->buf), want);
    if (n->body != p->bufs[n->buf]->body)
        return fail(C, "%s has body kind %d, but its buffer has %d", n->name, (int)n->body,
                    (int)p->bufs[n->buf]->body);
    if (n->np < 0 || n->np > KILN_MAX_RANK || n->nr < 0 || n->nr > KILN_MAX_RANK ||
        n->numel != util_numel(n->np, n->P) || n->rnumel != util_numel(n->nr, n->R))
        return fail(C, "%s has a group (%lld, %lld) that its loops do not give", n->name,
                    (long long)n->numel, (long long)n->rnumel);
    /* deps: reads of sources or of earlier nodes' buffers, then its one write */
    if (n->ndeps < 1 || !n->deps)
        return fail(C, "%s has no dependencies (not even its write)", n->name);
    for (int d = 0; d < n->ndeps; d++) {
        const Dep *dp = &n->deps[d];
        if (dp->buf < 0 || dp->buf >= p->nbufs)
            return fail(C, "%s has a dep on buffer id %d, outside the program", n->name, dp->buf);
        if (!dp->index || !dp->ix || dp->nsizes < 0 || dp->nsizes > KILN_MAX_RANK || dp->bytes < 0)
            return fail(C, "%s has a malformed dep on %s", n->name, bname(s, dp->buf));
        if (dp->write != (d == n->ndeps - 1))
            return fail(C, "%s has %s dep %d of %d (its write must be the last, and only it)",
                        n->name, dp->write ? "a write" : "a read as", d, n->ndeps);
        if (dp->write && dp->buf != n->buf)
            return fail(C, "%s writes %s, not its own %s", n->name, bname(s, dp->buf),
                        bname(s, n->buf));
        int q = s->node_of_buf[dp->buf];
        if (!dp->write && q >= k)
            return fail(C, "%s reads %s, which %s computes %s", n->name, bname(s, dp->buf),
                        s->nodes[q].name, q == k ? "itself" : "later");
    }
    return true;
}

/* The program's buffers against the nodes: one node per computed buffer. */
static bool check_nodes(Check *C) {
    const Schedule *s = C->s;
    const LoopProgram *p = s->prog;
    if (s->nnodes != p->ncomputed || (s->nnodes > 0 && !s->nodes) || !s->node_of_buf)
        return fail(C, "%d nodes for %d computed buffers", s->nnodes, p->ncomputed);
    for (int b = 0; b < p->nbufs; b++) {
        int k = s->node_of_buf[b];
        if (buf_computed(p->bufs[b]) ? k < 0 || k >= s->nnodes || s->nodes[k].buf != b : k != -1)
            return fail(C, "%s maps to node %d", bname(s, b), k);
    }
    for (int k = 0; k < s->nnodes; k++)
        if (!check_node(C, k)) return false;
    return true;
}

/* Is name the kernel's members' names joined by '_' (sched.c's new_group)? */
static bool named_after_members(const Schedule *s, const Kernel *k) {
    const char *c = k->name;
    for (int j = 0; j < k->n; j++) {
        const char *m = s->nodes[k->members[j]].name;
        size_t len = strlen(m);
        if (j && *c++ != '_') return false;
        if (strncmp(c, m, len)) return false;
        c += len;
    }
    return *c == 0;
}

/* Membership: each node in exactly one kernel, members ascending, sizes. */
static bool check_members(Check *C) {
    const Schedule *s = C->s;
    if (s->nkernels < 0 || s->nkernels > s->nnodes || (s->nkernels > 0 && !s->kernels))
        return fail(C, "%d kernels for %d nodes", s->nkernels, s->nnodes);
    for (int i = 0; i < s->nnodes; i++) C->kernel_of[i] = -1;
    for (int i = 0; i < s->nkernels; i++) {
        const Kernel *k = &s->kernels[i];
        if (k->n < 1 || !k->members || !k->stage || !k->store || !k->name || !k->kernel)
            return fail(C, "kernel %d (%s) has %d members or a missing table", i, kname(k), k->n);
        if (k->n > 1 && k->n > s->cfg.max_fusion_size)
            return fail(C, "kernel %d (%s) has %d members, more than max_fusion_size %d", i,
                        kname(k), k->n, s->cfg.max_fusion_size);
        for (int j = 0; j < k->n; j++) {
            int m = k->members[j];
            if (m < 0 || m >= s->nnodes || (j && m <= k->members[j - 1]))
                return fail(C, "kernel %d (%s) has member %d out of range or order", i, kname(k),
                            m);
            if (C->kernel_of[m] >= 0)
                return fail(C, "%s is a member of kernel %d (%s) and kernel %d (%s)",
                            s->nodes[m].name, C->kernel_of[m], kname(&s->kernels[C->kernel_of[m]]),
                            i, kname(k));
            C->kernel_of[m] = i;
            C->pos[m] = j;
        }
        if (!named_after_members(s, k))
            return fail(C, "kernel %d (%s) is named %s, not after its members", i, kname(k),
                        k->name);
    }
    for (int m = 0; m < s->nnodes; m++)
        if (C->kernel_of[m] < 0) return fail(C, "%s is in no kernel", s->nodes[m].name);
    return true;
}

/* Kind, loops and stages of kernel i. */
static bool check_structure(Check *C, int i) {
    const Schedule *s = C->s;
    const Kernel *k = &s->kernels[i];
    const SNode *first = &s->nodes[k->members[0]];
    bool ext = first->body == BODY_EXTERN, red = false;
    for (int j = 0; j < k->n; j++) {
        const SNode *x = &s->nodes[k->members[j]];
        red |= x->body == BODY_REDUCTION;
        if (j > 0 && x->body == BODY_EXTERN) /* an extern is never node2 */
            return fail(C, "kernel %d (%s) holds extern %s as member %d", i, kname(k), x->name, j);
        if (ext && j > 0 && x->body != BODY_POINTWISE && x->body != BODY_RAND)
            return fail(C, "kernel %d (%s) has %s in its epilogue, which is not pointwise", i,
                        kname(k), x->name);
    }
    KernelKind want = ext ? KK_EXTERN : red ? KK_REDUCTION : KK_POINTWISE;
    if (k->kind != want || k->loop_nests != (ext ? 0 : 1))
        return fail(C, "kernel %d (%s) is a %s kernel with %d loop nests; its members make it %s",
                    i, kname(k), (unsigned)k->kind <= KK_EXTERN ? kernel_kind_name[k->kind] : "?",
                    k->loop_nests, kernel_kind_name[want]);
    if (k->np < 0 || k->np > KILN_MAX_RANK || k->nr < 0 || k->nr > KILN_MAX_RANK ||
        k->numel != util_numel(k->np, k->P) || k->rnumel != util_numel(k->nr, k->R))
        return fail(C, "kernel %d (%s) has a group that its loops do not give", i, kname(k));
    int64_t full[2 * KILN_MAX_RANK];
    memcpy(full, k->P, sizeof(int64_t) * (size_t)k->np);
    memcpy(full + k->np, k->R, sizeof(int64_t) * (size_t)k->nr);
    for (int j = 0; j < k->n; j++) {
        const SNode *x = &s->nodes[k->members[j]];
        /* each member runs the kernel's loops (sched.c's struct_loops) */
        bool ok = ext ? sizes_eq(x->np, x->P, k->np, k->P)
                  : x->body == BODY_REDUCTION
                      ? sizes_eq(x->np, x->P, k->np, k->P) && sizes_eq(x->nr, x->R, k->nr, k->R)
                      : sizes_eq(x->np, x->P, k->np + k->nr, full) ||
                            (red && sizes_eq(x->np, x->P, k->np, k->P));
        if (!ok)
            return fail(C, "kernel %d (%s): %s does not iterate its loops", i, kname(k), x->name);
        if ((int)k->store[j] < STORE_GLOBAL || k->store[j] > STORE_ROW_LOCAL)
            return fail(C, "kernel %d (%s): %s has store kind %d", i, kname(k), x->name,
                        (int)k->store[j]);
        if (s->prog->bufs[x->buf]->is_output && k->store[j] != STORE_GLOBAL)
            return fail(C, "kernel %d (%s) keeps output %s in a %s", i, kname(k), bname(s, x->buf),
                        store_name[k->store[j]]);
    }
    if (ext) return true;
    if (k->nstages < 1 || !k->stage_kind)
        return fail(C, "kernel %d (%s) has %d stages", i, kname(k), k->nstages);
    for (int t = 0; t < k->nstages; t++)
        if ((int)k->stage_kind[t] < STAGE_INNER || k->stage_kind[t] > STAGE_ROW)
            return fail(C, "kernel %d (%s) has stage %d of kind %d", i, kname(k), t,
                        (int)k->stage_kind[t]);
    for (int j = 0; j < k->n; j++)
        if (k->stage[j] < 0 || k->stage[j] >= k->nstages)
            return fail(C, "kernel %d (%s): %s is at stage %d of %d", i, kname(k),
                        s->nodes[k->members[j]].name, k->stage[j], k->nstages);
    return true;
}

/* Call order, stage order and stores: what each member of kernel i reads. */
static bool check_reads(Check *C, int i) {
    const Schedule *s = C->s;
    const Kernel *k = &s->kernels[i];
    for (int j = 0; j < k->n; j++) {
        const SNode *x = &s->nodes[k->members[j]];
        for (int d = 0; d < x->ndeps; d++) {
            int q = x->deps[d].write ? -1 : s->node_of_buf[x->deps[d].buf];
            if (q < 0) continue; /* a source, or the write */
            int kq = C->kernel_of[q];
            const Kernel *pk = &s->kernels[kq];
            if (kq > i)
                return fail(C, "kernel %d (%s) reads %s, which kernel %d (%s) produces later", i,
                            kname(k), bname(s, x->deps[d].buf), kq, kname(pk));
            if (kq < i && pk->store[C->pos[q]] != STORE_GLOBAL)
                return fail(C, "kernel %d (%s) reads %s, which kernel %d (%s) keeps in a %s", i,
                            kname(k), bname(s, x->deps[d].buf), kq, kname(pk),
                            store_name[pk->store[C->pos[q]]]);
            if (kq < i || k->kind == KK_EXTERN) continue;
            int need = k->stage[C->pos[q]] + (s->nodes[q].body == BODY_REDUCTION);
            if (k->stage[j] < need)
                return fail(C,
                            "kernel %d (%s): %s at stage %d reads %s, computed at stage %d by "
                            "%s",
                            i, kname(k), x->name, k->stage[j], bname(s, x->deps[d].buf),
                            k->stage[C->pos[q]], s->nodes[q].name);
        }
    }
    return true;
}

/* Traffic: non-negative, fused the kernels' sum, unfused the program's. */
static bool check_traffic(Check *C) {
    const Schedule *s = C->s;
    int64_t sum = 0, sources = 0;
    for (int i = 0; i < s->nkernels; i++) {
        const Kernel *k = &s->kernels[i];
        if (k->load_bytes < 0 || k->store_bytes < 0)
            return fail(C, "kernel %d (%s) loads %lld bytes and stores %lld", i, kname(k),
                        (long long)k->load_bytes, (long long)k->store_bytes);
        sum += k->load_bytes + k->store_bytes;
    }
    if (s->fused_bytes != sum)
        return fail(C, "fused traffic is %lld bytes, but its kernels move %lld",
                    (long long)s->fused_bytes, (long long)sum);
    if (s->unfused_bytes < 0 || s->unfused_bytes != s->prog->unfused_bytes)
        return fail(C, "unfused traffic is %lld bytes; the loop program says %lld",
                    (long long)s->unfused_bytes, (long long)s->prog->unfused_bytes);
    for (int b = 0; b < s->prog->nbufs; b++)
        if (!buf_computed(s->prog->bufs[b]))
            sources += s->prog->bufs[b]->numel * loop_elsize(s->prog->bufs[b]->dtype);
    if (s->peak_bytes < sources)
        return fail(C, "peak memory %lld bytes is below the %lld bytes of inputs and weights",
                    (long long)s->peak_bytes, (long long)sources);
    return true;
}

/* Rounds chain from nnodes nodes to nkernels, fusing before - after pairs. */
static bool check_rounds(Check *C) {
    const Schedule *s = C->s;
    if (s->nrounds < 0 || s->nrounds > s->cfg.max_rounds || (s->nrounds > 0 && !s->rounds))
        return fail(C, "%d rounds (max_rounds %d)", s->nrounds, s->cfg.max_rounds);
    int left = s->nnodes;
    for (int r = 0; r < s->nrounds; r++) {
        const Round *R = &s->rounds[r];
        if (R->nodes_before != left || R->nodes_after > R->nodes_before ||
            R->nfused != R->nodes_before - R->nodes_after)
            return fail(C, "round %d fused %d pairs of %d nodes into %d (the last left %d)", r + 1,
                        R->nfused, R->nodes_before, R->nodes_after, left);
        for (int i = 0; i < R->nfused; i++)
            if (!group_name_ok(R->fused_a[i], s->nnodes) ||
                !group_name_ok(R->fused_b[i], s->nnodes))
                return fail(C, "round %d fused %s with %s, which are not fused nodes", r + 1,
                            R->fused_a[i] ? R->fused_a[i] : "(null)",
                            R->fused_b[i] ? R->fused_b[i] : "(null)");
        left = R->nodes_after;
    }
    if (left != s->nkernels)
        return fail(C, "the rounds left %d nodes, but there are %d kernels", left, s->nkernels);
    return true;
}

/* The fusion log: each entry's kind, round and names; one EV_ROUND and one
 * EV_DONE (with the round's counts) per round; a rejection per EV_REJECT. */
static bool check_events(Check *C) {
    const Schedule *s = C->s;
    int nround = 0, ndone = 0, nreject = 0;
    for (int i = 0; i < s->nevents; i++) {
        const Event *e = &s->events[i];
        if ((int)e->kind < EV_ROUND || e->kind > EV_DONE || e->round < 1 || e->round > s->nrounds)
            return fail(C, "event %d has kind %d in round %d of %d", i, (int)e->kind, e->round,
                        s->nrounds);
        bool pair = e->kind == EV_REJECT || e->kind == EV_DEFER || e->kind == EV_FUSE;
        if (pair ? !group_name_ok(e->a, s->nnodes) || !group_name_ok(e->b, s->nnodes)
                 : e->a || e->b)
            return fail(C, "event %d (round %d) names %s and %s", i, e->round,
                        e->a ? e->a : "(null)", e->b ? e->b : "(null)");
        if ((e->kind == EV_REJECT || e->kind == EV_DEFER) && !e->reason)
            return fail(C, "event %d (round %d) rejects %s with %s for no reason", i, e->round,
                        e->a, e->b);
        nround += e->kind == EV_ROUND;
        nreject += e->kind == EV_REJECT;
        if (e->kind == EV_DONE) {
            const Round *R = &s->rounds[e->round - 1];
            if (e->n0 != R->nodes_before || e->n1 != R->nodes_after)
                return fail(C,
                            "event %d ends round %d with %d -> %d nodes; the round says "
                            "%d -> %d",
                            i, e->round, e->n0, e->n1, R->nodes_before, R->nodes_after);
            ndone++;
        }
    }
    if (nround != s->nrounds || ndone != s->nrounds)
        return fail(C, "the log starts %d rounds and ends %d; %d ran", nround, ndone, s->nrounds);
    if (nreject != s->nrejected)
        return fail(C, "the log rejects %d pairs, the rejections list %d", nreject, s->nrejected);
    for (int i = 0; i < s->nrejected; i++) {
        const Rejection *r = &s->rejected[i];
        if (!group_name_ok(r->node1, s->nnodes) || !group_name_ok(r->node2, s->nnodes) ||
            !r->reason || r->round < 1 || r->round > s->nrounds)
            return fail(C, "rejection %d (round %d) names %s and %s", i, r->round,
                        r->node1 ? r->node1 : "(null)", r->node2 ? r->node2 : "(null)");
    }
    return true;
}

static bool check_schedule(Check *C) {
    if (!check_nodes(C) || !check_members(C)) return false;
    for (int i = 0; i < C->s->nkernels; i++)
        if (!check_structure(C, i)) return false;
    for (int i = 0; i < C->s->nkernels; i++)
        if (!check_reads(C, i)) return false;
    return check_traffic(C) && check_rounds(C) && check_events(C);
}

kiln_status sched_check(const Schedule *s, char *err, size_t errlen) {
    Check C = {.s = s, .err = err, .errlen = errlen};
    if (errlen) err[0] = 0;
    if (!s->prog || s->nnodes < 0) {
        fail(&C, "%d nodes of %s", s->nnodes, s->prog ? "a program" : "no program");
        return KILN_ERR_INPUT;
    }
    size_t n = (size_t)s->nnodes + 1;
    C.kernel_of = kcalloc(2 * n, sizeof(int));
    if (!C.kernel_of) {
        if (errlen) snprintf(err, errlen, "out of memory");
        return KILN_ERR_NOMEM;
    }
    C.pos = C.kernel_of + n;
    bool ok = check_schedule(&C);
    kfree(C.kernel_of);
    return ok ? KILN_OK : KILN_ERR_INPUT;
}
