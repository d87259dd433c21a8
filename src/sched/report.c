/*
 * report.c -- what the compiler decided, for people and for tools.
 *
 * `kiln explain` prints report_explain: the graph rewrites applied (Conv-BN
 * folding) or declined, the loop IR after inlining (with the
 * reason each value was materialized or recomputed), the scheduler nodes,
 * every fusion round as KILN_LOGS=fusion logs it (candidates, rejections with
 * their reasons, fusions), the final kernels with their loop nests, the call
 * sequence, memory traffic unfused vs fused and the planned peak memory.
 * An extern call with an epilogue is one kernel named after the library
 * call (extern_kernels.mm), its origins those of every member, its
 * epilogue members listed ("epilogue" in JSON) and printed under the call.
 *
 * Traffic: a kernel loads each distinct (buffer, index) it reads from
 * outside itself once and stores each member that leaves it (an output or
 * read by another kernel) once. For an extern call with an epilogue that
 * means its operands and the epilogue's other inputs (bias, BN parameters,
 * a residual) as loads; as stores, the library's output only when
 * something else reads it, and each stored epilogue member. The epilogue's
 * read of the library's output is not counted: it happens block by block,
 * from cache, right after the library wrote the block.
 * report_json writes the same facts as JSON (the fields are listed in
 * docs/design.md, "Reports"); report_dot draws the decomposed graph with
 * each op coloured by the kernel it landed in.
 */
#include "sched/sched.h"
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void sched_summary(const Schedule *s, PlanSummary *o) {
    memset(o, 0, sizeof *o);
    o->nodes_before = s->nnodes;
    o->nodes_after = s->nkernels;
    o->nrounds = s->nrounds;
    o->nkernels = s->nkernels;
    o->ncalls = s->nkernels;
    for (int i = 0; i < s->nkernels; i++) o->nextern += s->kernels[i].kind == KK_EXTERN;
    o->unfused_bytes = s->unfused_bytes;
    o->fused_bytes = s->fused_bytes;
    o->peak_memory_bytes = s->peak_bytes;
}

/* ===== loop nests ======================================================================= */

static void pad(FILE *f, const char *indent, int depth) {
    fputs(indent, f);
    for (int i = 0; i < depth; i++) fputs("  ", f);
}

static void print_loop(FILE *f, const char *indent, int depth, int var, int64_t size) {
    pad(f, indent, depth);
    fprintf(f, "for v%d in 0..%lld:\n", var, (long long)size);
}

/* One member: `buf1[index] = expr` (a reduction accumulates: rop(acc, expr)). */
static void print_member(FILE *f, const Schedule *s, const Kernel *k, int i, const char *indent,
                         int depth) {
    const SNode *n = &s->nodes[k->members[i]];
    const Buffer *b = s->prog->bufs[n->buf];
    Pool tmp = {{0}, NULL};
    Str e;
    str_init(&e, &tmp);
    const char *ix = n->deps[n->ndeps - 1].ix;
    if (b->body == BODY_REDUCTION) {
        str_putf(&e, "%s[%s] = %s(%s[%s], ", b->name, ix, rop_name[b->rop], b->name, ix);
        ex_print(&e, s->prog, b->expr);
        str_putf(&e, ")");
    } else if (b->body == BODY_RAND) {
        str_putf(&e, "%s[%s] = rand(seed=%llu, %s)", b->name, ix, (unsigned long long)b->seed, ix);
    } else {
        str_putf(&e, "%s[%s] = ", b->name, ix);
        ex_print(&e, s->prog, b->expr);
    }
    pad(f, indent, depth);
    fprintf(f, "%s    # %s\n", str_get(&e), store_name[k->store[i]]);
    pool_free(&tmp);
}

/* The library call, then its epilogue members: the same loop body a
 * pointwise kernel would run, applied to each output block in cache. */
static void print_extern(FILE *f, const Schedule *s, const Kernel *k, const char *indent) {
    const Buffer *b = s->prog->bufs[s->nodes[k->members[0]].buf];
    pad(f, indent, 0);
    fprintf(f, "%s = %s(", b->name, k->kernel);
    for (int i = 0; i < b->nopnds; i++) {
        const BufView *v = &b->opnd[i];
        fprintf(f, "%s%s[strides", i ? ", " : "", s->prog->bufs[v->buf]->name);
        for (int d = 0; d < v->rank; d++) fprintf(f, " %lld", (long long)v->stride[d]);
        fprintf(f, "]");
    }
    fprintf(f, ")");
    if (k->n > 1 && k->store[0] != STORE_GLOBAL)
        fprintf(f, "    # into %s's memory, which the epilogue overwrites in place",
                s->prog->bufs[s->nodes[k->members[k->n - 1]].buf]->name);
    else if (k->n > 1)
        fprintf(f, "    # %s", store_name[k->store[0]]);
    fprintf(f, "\n");
    char pbuf[400];
    const char *path = sched_extern_path(s->prog, b, pbuf, sizeof pbuf);
    if (path) {
        pad(f, indent, 0);
        fprintf(f, "# runs on %s\n", path);
    }
    if (k->n == 1) return;
    pad(f, indent, 0);
    fprintf(f, "# epilogue, on each output block the library has just computed:\n");
    for (int i = 1; i < k->n; i++) print_member(f, s, k, i, indent, 1);
}

void report_loop_nest(FILE *f, const Schedule *s, const Kernel *k, const char *indent) {
    if (k->kind == KK_EXTERN) {
        print_extern(f, s, k, indent);
        return;
    }
    for (int d = 0; d < k->np; d++) print_loop(f, indent, d, d, k->P[d]);
    for (int st = 0; st < k->nstages; st++) {
        int depth = k->np;
        if (k->kind == KK_REDUCTION && k->stage_kind[st] == STAGE_INNER) {
            pad(f, indent, depth);
            fprintf(f, "# stage %d: inner loop\n", st);
            for (int r = 0; r < k->nr; r++) print_loop(f, indent, depth++, k->np + r, k->R[r]);
        } else if (k->kind == KK_REDUCTION) {
            pad(f, indent, depth);
            fprintf(f, "# stage %d: per row\n", st);
        }
        for (int i = 0; i < k->n; i++)
            if (k->stage[i] == st) print_member(f, s, k, i, indent, depth);
    }
}

/* ===== explain ============================================================================ */

static void print_decisions(FILE *f, const LoopProgram *p) {
    for (int i = 0; i < p->ndec; i++) {
        const InlineDecision *d = &p->dec[i];
        const Node *n = graph_node(p->g, d->node);
        if (d->buf >= 0)
            fprintf(f, "  %%%d %s -> %s: %s\n", d->node, op_info[n->op].name, p->bufs[d->buf]->name,
                    d->reason);
        else
            fprintf(f, "  %%%d %s inlined: %s\n", d->node, op_info[n->op].name, d->reason);
    }
}

static void print_kernel(FILE *f, const Schedule *s, int i) {
    const Kernel *k = &s->kernels[i];
    fprintf(f, "kernel %d: %s  (%s; nodes %s; group (%lld, %lld); %d loop nest%s", i, k->kernel,
            kernel_kind_name[k->kind], k->name, (long long)k->numel, (long long)k->rnumel,
            k->loop_nests, k->loop_nests == 1 ? "" : "s");
    if (k->kind == KK_REDUCTION) fprintf(f, "; %d stage%s", k->nstages, k->nstages == 1 ? "" : "s");
    if (k->kind != KK_EXTERN) fprintf(f, "; ~%d live vector values", k->regs);
    if (k->kind == KK_EXTERN && k->n > 1) {
        fprintf(f, "; epilogue");
        for (int j = 1; j < k->n; j++) fprintf(f, " %s", s->nodes[k->members[j]].name);
    }
    fprintf(f, ")\n  origins: [");
    for (int j = 0; j < k->norigins; j++) fprintf(f, "%s%s", j ? ", " : "", k->origins[j]);
    fprintf(f, "]\n  traffic: loads %lld bytes, stores %lld bytes\n", (long long)k->load_bytes,
            (long long)k->store_bytes);
    report_loop_nest(f, s, k, "    ");
}

static void print_traffic(FILE *f, const Schedule *s) {
    fprintf(f, "== memory traffic\n");
    fprintf(f, "  unfused (each op reads its operands, writes its result): %lld bytes\n",
            (long long)s->unfused_bytes);
    fprintf(f, "  fused (each kernel loads its inputs, stores its outputs): %lld bytes\n",
            (long long)s->fused_bytes);
    bool epilogues = false;
    for (int i = 0; i < s->nkernels; i++)
        epilogues |= s->kernels[i].kind == KK_EXTERN && s->kernels[i].n > 1;
    if (epilogues)
        fprintf(f,
                "  (an extern call with an epilogue loads its operands and the epilogue's other\n"
                "   inputs, and stores each buffer it leaves in memory once; the epilogue reads\n"
                "   the library's output from cache, which counts as no traffic)\n");
    if (s->fused_bytes > 0)
        fprintf(f, "  ratio: %.2fx less traffic\n",
                (double)s->unfused_bytes / (double)s->fused_bytes);
    fprintf(f, "== peak memory (planned, buffers reused after their last use): %lld bytes\n",
            (long long)s->peak_bytes);
}

/* The tier line: which instructions the kernels are compiled for. */
static void print_target(FILE *f, const Target *t) {
    fprintf(f, "== target: %s (%s), %d float lanes per vector\n", t->name, t->flags, t->lanes);
}

void report_explain(FILE *f, const Schedule *s) {
    const LoopProgram *p = s->prog;
    print_target(f, &s->cfg.target);
    if (s->g->nnotes) fprintf(f, "== rewrites\n");
    for (const GraphNote *n = s->g->notes; n; n = n->next) fprintf(f, "  %s\n", n->text);
    fprintf(f, "== loop IR after inlining (%d buffers, %d computed)\n", p->nbufs, p->ncomputed);
    lower_print(f, p);
    fprintf(f, "== inlining decisions\n");
    print_decisions(f, p);
    fprintf(f, "== scheduler nodes before fusion: %d\n", s->nnodes);
    sched_print_nodes(f, s);
    fprintf(f, "== fusion\n");
    for (int i = 0; i < s->nevents; i++) sched_print_event(f, s, &s->events[i]);
    fprintf(f, "== kernels: %d\n", s->nkernels);
    for (int i = 0; i < s->nkernels; i++) print_kernel(f, s, i);
    fprintf(f, "== call sequence: [");
    for (int i = 0; i < s->nkernels; i++) fprintf(f, "%s'%s'", i ? ", " : "", s->kernels[i].kernel);
    fprintf(f, "]\n");
    print_traffic(f, s);
}

/* ===== JSON ================================================================================ */

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static void json_kernel(FILE *f, const Schedule *s, const Kernel *k) {
    fprintf(f, "{\"name\": ");
    json_str(f, k->kernel);
    fprintf(f, ", \"kind\": \"%s\", \"origins\": [", kernel_kind_name[k->kind]);
    for (int j = 0; j < k->norigins; j++) {
        if (j) fprintf(f, ", ");
        json_str(f, k->origins[j]);
    }
    fprintf(f, "], \"loop_nests\": %d, \"nodes\": [", k->loop_nests);
    for (int j = 0; j < k->n; j++) {
        if (j) fprintf(f, ", ");
        json_str(f, s->nodes[k->members[j]].name);
    }
    fprintf(f, "]");
    if (k->kind == KK_EXTERN) { /* the members run on each output block of the call */
        fprintf(f, ", \"epilogue\": [");
        for (int j = 1; j < k->n; j++) {
            if (j > 1) fprintf(f, ", ");
            json_str(f, s->nodes[k->members[j]].name);
        }
        fprintf(f, "]");
        char pbuf[400];
        const char *path = sched_extern_path(s->prog, s->prog->bufs[s->nodes[k->members[0]].buf],
                                             pbuf, sizeof pbuf);
        if (path) {
            fprintf(f, ", \"runs_on\": ");
            json_str(f, path);
        }
    }
    fprintf(f,
            ", \"group\": [%lld, %lld], \"stages\": %d, \"registers\": %d, "
            "\"load_bytes\": %lld, \"store_bytes\": %lld}",
            (long long)k->numel, (long long)k->rnumel, k->nstages, k->regs,
            (long long)k->load_bytes, (long long)k->store_bytes);
}

static void json_rounds(FILE *f, const Schedule *s) {
    fprintf(f, "\"rounds\": [");
    for (int i = 0; i < s->nrounds; i++) {
        const Round *r = &s->rounds[i];
        fprintf(f, "%s{\"possible\": %d, \"fused\": [", i ? ", " : "", r->possible);
        for (int j = 0; j < r->nfused; j++) {
            fprintf(f, "%s[", j ? ", " : "");
            json_str(f, r->fused_a[j]);
            fprintf(f, ", ");
            json_str(f, r->fused_b[j]);
            fprintf(f, "]");
        }
        fprintf(f, "], \"nodes_before\": %d, \"nodes_after\": %d}", r->nodes_before,
                r->nodes_after);
    }
    fprintf(f, "]");
}

static void json_rejected(FILE *f, const Schedule *s) {
    fprintf(f, "\"rejected\": [");
    for (int i = 0; i < s->nrejected; i++) {
        const Rejection *r = &s->rejected[i];
        fprintf(f, "%s{\"node1\": ", i ? ", " : "");
        json_str(f, r->node1);
        fprintf(f, ", \"node2\": ");
        json_str(f, r->node2);
        fprintf(f, ", \"reason\": ");
        json_str(f, r->reason);
        fprintf(f, ", \"round\": %d}", r->round);
    }
    fprintf(f, "]");
}

void report_json(FILE *f, const Schedule *s, const ReportHooks *hooks) {
    fprintf(f, "{\"kernels\": [");
    for (int i = 0; i < s->nkernels; i++) {
        fprintf(f, i ? ",\n  " : "\n  ");
        json_kernel(f, s, &s->kernels[i]);
    }
    fprintf(f, "],\n \"calls\": [");
    for (int i = 0; i < s->nkernels; i++) {
        if (i) fprintf(f, ", ");
        json_str(f, s->kernels[i].kernel);
    }
    fprintf(f, "],\n \"fusion\": {\"nodes_before\": %d, \"nodes_after\": %d, ", s->nnodes,
            s->nkernels);
    json_rounds(f, s);
    fprintf(f, ",\n   ");
    json_rejected(f, s);
    fprintf(f,
            "},\n \"traffic\": {\"unfused_bytes\": %lld, \"fused_bytes\": %lld},\n"
            " \"peak_memory_bytes\": %lld",
            (long long)s->unfused_bytes, (long long)s->fused_bytes, (long long)s->peak_bytes);
    fprintf(f, ",\n \"rewrites\": [");
    for (const GraphNote *n = s->g->notes; n; n = n->next) {
        json_str(f, n->text);
        if (n->next) fprintf(f, ", ");
    }
    fprintf(f, "],\n \"target\": {\"name\": ");
    json_str(f, s->cfg.target.name ? s->cfg.target.name : "");
    fprintf(f, ", \"flags\": ");
    json_str(f, s->cfg.target.flags);
    fprintf(f, ", \"lanes\": %d}", s->cfg.target.lanes);
    if (hooks && hooks->fn) hooks->fn(f, hooks->ud);
    fprintf(f, "}\n");
}

/* ===== Graphviz ============================================================================ */

static const char *const palette[] = {
    "#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462",
    "#b3de69", "#fccde5", "#bc80bd", "#ccebc5", "#ffed6f", "#d9d9d9",
};

/* The kernels (by call index) whose buffers compute graph node id. */
static int kernels_of(const Schedule *s, int id, int *out, int max) {
    int n = 0;
    for (int k = 0; k < s->nkernels && n < max; k++)
        for (int i = 0; i < s->kernels[k].n; i++) {
            const Buffer *b = s->prog->bufs[s->nodes[s->kernels[k].members[i]].buf];
            bool hit = false;
            for (int c = 0; c < b->ncover && !hit; c++) hit = b->cover[c] == id;
            if (hit) {
                out[n++] = k;
                break;
            }
        }
    return n;
}

static void dot_node(FILE *f, const Schedule *s, int id) {
    const Node *n = graph_node(s->g, id);
    OpKind kind = op_info[n->op].kind;
    if (n->op == OP_CONST) {
        fprintf(f, "  n%d [label=\"%g\", shape=plaintext];\n", id, n->f[0]);
        return;
    }
    if (kind == KIND_SOURCE) {
        fprintf(f, "  n%d [label=\"%s\\n%s\", fillcolor=\"#eeeeee\"];\n", id,
                n->name ? n->name : "?", op_info[n->op].name);
        return;
    }
    int ks[8], nk = kernels_of(s, id, ks, 8);
    fprintf(f, "  n%d [label=\"%%%d %s", id, id, op_info[n->op].name);
    if (n->origin && strcmp(n->origin, op_info[n->op].name)) fprintf(f, " (%s)", n->origin);
    for (int i = 0; i < nk; i++) fprintf(f, "\\n%s", s->kernels[ks[i]].kernel);
    if (nk)
        fprintf(f, "\", fillcolor=\"%s\"", palette[ks[0] % 12]);
    else
        fprintf(f, "\", style=dashed");
    fprintf(f, "];\n");
}

void report_dot(FILE *f, const Schedule *s) {
    const Graph *g = s->g;
    fprintf(f, "digraph kiln {\n  rankdir=TB;\n"
               "  node [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\"];\n");
    for (int i = 0; i < g->n; i++) {
        if (!s->prog->live[i]) continue;
        dot_node(f, s, i);
        const Node *n = graph_node(g, i);
        for (int j = 0; j < n->nin; j++)
            if (n->in[j] >= 0) fprintf(f, "  n%d -> n%d;\n", n->in[j], i);
    }
    for (int i = 0; i < g->noutputs; i++) {
        fprintf(f, "  out%d [label=", i);
        json_str(f, g->outnames[i]);
        fprintf(f, ", shape=ellipse, fillcolor=white];\n  n%d -> out%d;\n", g->outputs[i], i);
    }
    fprintf(f, "}\n");
}
