/*
 * graph.c -- the graph IR: graphs, their errors, outputs and inspection.
 * The public builders that append nodes are build.c.
 *
 * A graph is an array of nodes in program order: a node's operands always
 * come before it, so the array is a topological order and every later pass
 * can walk it front to back. Builders check their operands and infer the
 * result's shape (numpy broadcasting for pointwise ops, PyTorch rules for the
 * rest) before a node is appended, so a graph that exists is well typed.
 *
 * Failures are sticky: the first message is kept in the graph, the builder
 * returns KILN_NONE, and a builder handed KILN_NONE fails without replacing
 * the message. Composite ops (softmax, layer_norm, ...) are stored as single
 * nodes here; decompose.c rewrites them before lowering or interpreting.
 */
#include "graph/graph.h"
#include <math.h>
#include <string.h>

/* ---- graphs and errors ------------------------------------------------- */

kiln_graph *kiln_graph_new(void) { return kcalloc(1, sizeof(kiln_graph)); }

void graph_call_free(GraphCall *c) {
    if (!c) return;
    kiln_graph_free(c->body[0]);
    kiln_graph_free(c->body[1]);
    kfree(c);
}

static void free_calls(GraphCall *c) {
    while (c) {
        GraphCall *next = c->next;
        graph_call_free(c);
        c = next;
    }
}

void kiln_graph_free(kiln_graph *g) {
    if (!g) return;
    free_calls(g->calls);
    kfree(g->nodes);
    kfree(g->inputs);
    kfree(g->outputs);
    kfree(g->outnames);
    kfree(g->model);
    kfree(g->model_name);
    arena_free(&g->arena);
    kfree(g);
}

const char *kiln_error(const kiln_graph *g) { return g ? g->err : "no graph (out of memory)"; }

int graph_fail(Graph *g, kiln_status st, const char *fmt, ...) {
    if (g->status != KILN_OK) return KILN_NONE;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->err, sizeof g->err, fmt, ap);
    va_end(ap);
    g->status = st;
    return KILN_NONE;
}

void graph_clear_error(Graph *g) {
    g->status = KILN_OK;
    g->err[0] = 0;
}

int graph_nomem(Graph *g) { return graph_fail(g, KILN_ERR_NOMEM, "out of memory"); }

bool graph_note(Graph *g, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    GraphNote *n = arena_alloc(&g->arena, sizeof *n);
    if (!n || !(n->text = arena_strdup(&g->arena, buf))) return false;
    GraphNote **tail = &g->notes;
    while (*tail) tail = &(*tail)->next;
    *tail = n;
    g->nnotes++;
    return true;
}

bool graph_push_int(int **arr, int *n, int *cap, int v) {
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 8;
        int *na = krealloc(*arr, sizeof(int) * (size_t)nc);
        if (!na) return false;
        *arr = na;
        *cap = nc;
    }
    (*arr)[(*n)++] = v;
    return true;
}

int graph_add(Graph *g, const Node *n) {
    if (g->n == g->cap) {
        int nc = g->cap ? g->cap * 2 : 64;
        Node *nn = krealloc(g->nodes, sizeof(Node) * (size_t)nc);
        if (!nn) return graph_nomem(g);
        g->nodes = nn;
        g->cap = nc;
    }
    Node *d = &g->nodes[g->n];
    *d = *n;
    if (!d->origin) d->origin = g->origin ? g->origin : op_info[n->op].name;
    return g->n++;
}

int *graph_use_counts(const Graph *g) {
    int *uses = kcalloc((size_t)(g->n ? g->n : 1), sizeof(int));
    if (!uses) return NULL;
    for (int i = 0; i < g->n; i++)
        for (int k = 0; k < g->nodes[i].nin; k++)
            if (g->nodes[i].in[k] >= 0) uses[g->nodes[i].in[k]]++;
    for (int i = 0; i < g->noutputs; i++) uses[g->outputs[i]]++;
    return uses;
}

/* ---- control flow: the calls of sub-programs ---------------------------------- */

const char *graph_call_part(const GraphCall *c, int k) {
    return c->kind != CALL_IF ? "body" : k ? "else_branch" : "then_branch";
}

void graph_call_name(char *buf, size_t len, const char *path, const GraphCall *c, int k) {
    util_fmt(buf, len, "%s%s%s, %s", path, *path ? " > " : "", c->label ? c->label : "call",
             graph_call_part(c, k));
}

void graph_call_refusal(const GraphCall *c, int b, char *buf, size_t len) {
    util_fmt(buf, len, "%s: the condition takes the %s, which kiln refused: %s",
             c->label ? c->label : "If", graph_call_part(c, b), c->refused[b]);
}

int graph_call_ncap(const GraphCall *c, int b) {
    int n = c->body[b] ? c->body[b]->ninputs : 0;
    return c->kind == CALL_IF ? n : n - (c->loop ? 2 : 0) - c->nstate - c->nscan_in;
}

int64_t graph_call_numel(const kiln_graph *body, bool output, int k) {
    return node_numel(&body->nodes[output ? body->outputs[k] : body->inputs[k]]);
}

/* Sum of body b's inputs (or outputs) [from, from + count). */
static int64_t numel_sum(const kiln_graph *body, bool output, int from, int count) {
    int64_t s = 0;
    for (int k = from; k < from + count; k++) s += graph_call_numel(body, output, k);
    return s;
}

int64_t graph_call_in_numel(const GraphCall *c) {
    if (c->kind == CALL_IF)
        return 1 + numel_sum(c->body[0], false, 0, graph_call_ncap(c, 0)) +
               numel_sum(c->body[1], false, 0, graph_call_ncap(c, 1));
    const kiln_graph *b = c->body[0];
    int first = c->loop ? 2 : 0;
    int64_t n = c->has_trip + c->has_cond + numel_sum(b, false, first, c->nstate);
    n += c->trips * numel_sum(b, false, first + c->nstate, c->nscan_in);
    n += numel_sum(b, false, first + c->nstate + c->nscan_in, graph_call_ncap(c, 0));
    return n > 0 ? n : 1; /* an operand of nothing holds one unused element */
}

int64_t graph_call_out_numel(const GraphCall *c) {
    if (c->kind == CALL_IF) {
        const kiln_graph *b = c->body[0] ? c->body[0] : c->body[1];
        return numel_sum(b, true, 0, b->noutputs);
    }
    const kiln_graph *b = c->body[0];
    int first = c->loop ? 1 : 0;
    int64_t states = numel_sum(b, true, first, c->nstate);
    int64_t scans =
        c->nscan_out ? c->trips * numel_sum(b, true, first + c->nstate, c->nscan_out) : 0;
    return 2 * states + scans + (c->loop ? 3 : 0);
}

int64_t graph_call_trips(double v) {
    if (v != v || v >= 9223372036854775807.0) return -1;
    return v < 0 ? 0 : (int64_t)v;
}

kiln_value graph_call(Graph *g, GraphCall *c, kiln_value packed) {
    if (!c) return graph_nomem(g);
    c->next = g->calls;
    g->calls = c;
    if (!graph_ok_value(g, packed, "call")) return KILN_NONE;
    const Node *p = &g->nodes[packed];
    if (c->kind == CALL_LOOP && c->nscan_out && c->trips < 0)
        return graph_fail(g, KILN_ERR_INPUT, "call: scan outputs need a known trip count");
    if (p->rank != 1 || p->shape[0] != graph_call_in_numel(c) ||
        (p->dtype != KILN_F32 && p->dtype != KILN_F64))
        return graph_fail(g, KILN_ERR_INPUT, "call: the packed operand does not match the call");
    Node n;
    memset(&n, 0, sizeof n);
    n.op = OP_CALL;
    n.dtype = p->dtype;
    n.rank = 1;
    n.shape[0] = graph_call_out_numel(c);
    n.nin = 1;
    n.in[0] = packed;
    for (int k = 1; k < MAX_IN; k++) n.in[k] = -1;
    n.call = c;
    return graph_add(g, &n);
}

/* A call copied into dst: its bodies decomposed there (the interpreter and
 * the runtime take decomposed graphs), owned by dst. */
static const GraphCall *copy_call(Graph *dst, const GraphCall *c) {
    GraphCall *d = kmalloc(sizeof *d);
    if (!d) return NULL;
    *d = *c;
    d->body[0] = d->body[1] = NULL;
    d->next = dst->calls;
    dst->calls = d;
    if (c->label && !(d->label = arena_strdup(&dst->arena, c->label))) return NULL;
    for (int b = 0; b < 2; b++)
        if (c->refused[b] && !(d->refused[b] = arena_strdup(&dst->arena, c->refused[b])))
            return NULL;
    for (int b = 0; b < 2; b++) {
        if (!c->body[b]) continue;
        if (!(d->body[b] = kiln_graph_new())) return NULL;
        if (dec_run(c->body[b], d->body[b]) != KILN_OK) {
            graph_fail(dst, d->body[b]->status, "%s", d->body[b]->err);
            return NULL;
        }
    }
    return d;
}

int graph_copy_node(Graph *dst, const Graph *src, int id, const int *map) {
    Node n = src->nodes[id];
    if (n.call && !(n.call = copy_call(dst, n.call)))
        return dst->status ? KILN_NONE : graph_nomem(dst);
    for (int k = 0; k < n.nin; k++)
        if (n.in[k] >= 0) n.in[k] = map[n.in[k]];
    n.origin = NULL;
    if (src->nodes[id].origin && !(n.origin = arena_strdup(&dst->arena, src->nodes[id].origin)))
        return graph_nomem(dst);
    if (n.name && !(n.name = arena_strdup(&dst->arena, n.name))) return graph_nomem(dst);
    if (n.data) {
        size_t bytes = (size_t)(node_numel(&n) * loop_storage_size(n.dtype));
        float *d = arena_alloc_lines(&dst->arena, bytes ? bytes : sizeof(double));
        if (!d) return graph_nomem(dst);
        memcpy(d, src->nodes[id].data, bytes);
        n.data = d;
    }
    int r = graph_add(dst, &n);
    if (r >= 0 && n.op == OP_INPUT &&
        !graph_push_int(&dst->inputs, &dst->ninputs, &dst->capinputs, r))
        return graph_nomem(dst);
    return r;
}

/* "[2, 3]" */
void graph_shape_str(char *buf, size_t len, int rank, const int64_t *shape) {
    size_t o = 0;
    o += (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < rank && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

bool graph_ok_value(Graph *g, kiln_value v, const char *op) {
    if (g->status != KILN_OK) return false;
    if (v < 0 || v >= g->n) {
        graph_fail(g, KILN_ERR_INPUT, "%s: invalid value %d", op, (int)v);
        return false;
    }
    return true;
}

/* ---- outputs and inspection --------------------------------------------- */

kiln_status kiln_output(kiln_graph *g, kiln_value v, const char *name) {
    if (!graph_ok_value(g, v, "output")) return g->status;
    if (!name || !*name)
        return (graph_fail(g, KILN_ERR_INPUT, "an output needs a name"), g->status);
    for (int i = 0; i < g->noutputs; i++)
        if (strcmp(g->outnames[i], name) == 0)
            return (graph_fail(g, KILN_ERR_INPUT, "output '%s' is declared twice", name),
                    g->status);
    const char *nm = arena_strdup(&g->arena, name);
    int cap = g->capoutputs;
    if (!nm || !graph_push_int(&g->outputs, &g->noutputs, &g->capoutputs, v))
        return (graph_nomem(g), g->status);
    if (cap != g->capoutputs) {
        const char **nn = krealloc(g->outnames, sizeof(char *) * (size_t)g->capoutputs);
        if (!nn) {
            g->noutputs--;
            return (graph_nomem(g), g->status);
        }
        g->outnames = nn;
    }
    g->outnames[g->noutputs - 1] = nm;
    return KILN_OK;
}

static bool valid(const kiln_graph *g, kiln_value v) { return g && v >= 0 && v < g->n; }

int kiln_value_rank(const kiln_graph *g, kiln_value v) {
    return valid(g, v) ? g->nodes[v].rank : -1;
}
const int64_t *kiln_value_shape(const kiln_graph *g, kiln_value v) {
    return valid(g, v) ? g->nodes[v].shape : NULL;
}
kiln_dtype kiln_value_dtype(const kiln_graph *g, kiln_value v) {
    return valid(g, v) ? g->nodes[v].dtype : KILN_F32;
}
int kiln_num_inputs(const kiln_graph *g) { return g->ninputs; }
int kiln_num_outputs(const kiln_graph *g) { return g->noutputs; }
const char *kiln_input_name(const kiln_graph *g, int i) {
    return i >= 0 && i < g->ninputs ? g->nodes[g->inputs[i]].name : NULL;
}
const char *kiln_output_name(const kiln_graph *g, int i) {
    return i >= 0 && i < g->noutputs ? g->outnames[i] : NULL;
}

static kiln_tensor desc(const Node *n) {
    kiln_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = n->dtype;
    t.rank = n->rank;
    memcpy(t.shape, n->shape, sizeof t.shape);
    return t;
}
kiln_tensor kiln_input_desc(const kiln_graph *g, int i) {
    kiln_tensor t = {0};
    return i >= 0 && i < g->ninputs ? desc(&g->nodes[g->inputs[i]]) : t;
}
kiln_tensor kiln_output_desc(const kiln_graph *g, int i) {
    kiln_tensor t = {0};
    return i >= 0 && i < g->noutputs ? desc(&g->nodes[g->outputs[i]]) : t;
}

/* "f32[2, 3]" (an out-of-range dtype prints as "?") */
static void type_str(char *buf, size_t len, const kiln_tensor *t) {
    char dims[160];
    graph_shape_str(dims, sizeof dims, t->rank, t->shape);
    util_fmt(buf, len, "%s%s", (unsigned)t->dtype <= KILN_BF16 ? kiln_dtype_name(t->dtype) : "?",
             dims);
}

kiln_status graph_check_input(const Graph *g, int i, const kiln_tensor *t, char *err,
                              size_t errlen) {
    kiln_tensor want = kiln_input_desc(g, i);
    const char *name = kiln_input_name(g, i);
    if (t->rank < 0 || t->rank > KILN_MAX_RANK) {
        util_fmt(err, errlen, "input '%s': rank %d is out of range", name, t->rank);
        return KILN_ERR_INPUT;
    }
    bool same = want.dtype == t->dtype && want.rank == t->rank;
    for (int d = 0; same && d < t->rank; d++) same = want.shape[d] == t->shape[d];
    if (!same) {
        char a[200], b[200];
        type_str(a, sizeof a, &want);
        type_str(b, sizeof b, t);
        util_fmt(err, errlen, "input '%s': expected %s, got %s", name, a, b);
        return KILN_ERR_INPUT;
    }
    if (!t->data && kiln_tensor_numel(t) > 0) {
        util_fmt(err, errlen, "input '%s': no data", name);
        return KILN_ERR_INPUT;
    }
    return KILN_OK;
}

void graph_dump_node(FILE *f, const Graph *g, int i) {
    const Node *n = &g->nodes[i];
    char s[160];
    graph_shape_str(s, sizeof s, n->rank, n->shape);
    fprintf(f, "  %%%d = %s(", i, op_info[n->op].name);
    for (int k = 0; k < n->nin; k++)
        fprintf(f, k ? ", %s%d" : "%s%d", n->in[k] >= 0 ? "%" : "", n->in[k] >= 0 ? n->in[k] : 0);
    if (n->op == OP_CONST) fprintf(f, "%g", n->f[0]);
    if (n->call) fprintf(f, "; %s", n->call->label ? n->call->label : "");
    if (n->name) fprintf(f, "%s'%s'", n->nin ? ", " : "", n->name);
    for (int k = 0; k < n->nattr; k++)
        fprintf(f, "%s%lld", k ? "," : (n->nin || n->name ? "; " : ""), (long long)n->attr[k]);
    fprintf(f, ") : %s%s", kiln_dtype_name(n->dtype), s);
    if (n->origin && strcmp(n->origin, op_info[n->op].name) != 0)
        fprintf(f, "  origin=%s", n->origin);
    fputc('\n', f);
}

void kiln_graph_dump(const kiln_graph *g, void *stream) {
    FILE *f = stream;
    fprintf(f, "graph: %d nodes\n", g->n);
    for (int i = 0; i < g->n; i++) graph_dump_node(f, g, i);
    for (int i = 0; i < g->noutputs; i++)
        fprintf(f, "  output %s = %%%d\n", g->outnames[i], g->outputs[i]);
}
