/* plan.c -- the pipeline driver up to scheduling: decompose -> lower ->
 * schedule, owned as one Plan. The loop IR and the schedule are checked
 * (loop_check, sched_check) right after the pass that made each: cheap, and
 * a failure is a compiler bug reported before codegen acts on it. */
#include "runtime/runtime.h"
#include <string.h>

/* ===== the plan ============================================================================ */

kiln_status plan_build(const Graph *g, const KilnConfig *cfg, Plan **out, char *err,
                       size_t errlen) {
    *out = NULL;
    Plan *p = kcalloc(1, sizeof *p);
    if (!p || !(p->dec = kiln_graph_new())) {
        kfree(p);
        if (errlen) snprintf(err, errlen, "out of memory");
        return KILN_ERR_NOMEM;
    }
    /* the front end's notes (an ONNX If folded, a Loop unrolled) first */
    kiln_status st = KILN_OK;
    for (const GraphNote *n = g->notes; n && st == KILN_OK; n = n->next)
        if (!graph_note(p->dec, "%s", n->text)) st = KILN_ERR_NOMEM;
    if (st == KILN_OK) st = dec_run(g, p->dec);
    if (st != KILN_OK && errlen) snprintf(err, errlen, "%s", kiln_error(p->dec));
    for (const GraphNote *n = p->dec->notes; st == KILN_OK && n; n = n->next)
        loop_log(cfg, LOG_REWRITE, "rewrite: %s\n", n->text);
    if (st == KILN_OK) st = lower_run(p->dec, cfg, &p->prog, err, errlen);
    if (st == KILN_OK) st = loop_check(p->prog, err, errlen);
    if (st == KILN_OK) st = sched_run(p->prog, cfg, &p->sched, err, errlen);
    if (st == KILN_OK) st = sched_check(p->sched, err, errlen);
    if (st != KILN_OK) {
        plan_free(p);
        return st;
    }
    *out = p;
    return KILN_OK;
}

void plan_free(Plan *p) {
    if (!p) return;
    sched_free(p->sched);
    lower_free(p->prog);
    if (p->dec) kiln_graph_free(p->dec);
    kfree(p);
}
