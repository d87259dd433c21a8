/* config.c -- KilnConfig defaults and the KILN_LOGS switch. */
#include "base/base.h"
#include <stdlib.h>
#include <string.h>

/* ===== configuration and logs ========================================================== */

KilnConfig kiln_config_default(void) {
    KilnConfig c;
    memset(&c, 0, sizeof c);
    c.max_inline_users = 4;
    c.max_inline_ops = 32;
    c.max_fusion_size = 64;
    c.max_rounds = 10;
    c.vector_registers = 32;
    c.proximity_window = 64;
    c.peak_memory_slack = 0.0;
    c.extern_epilogue = true;
    const char *pairs = getenv("KILN_ROW_PAIRS");
    c.row_pairs =
        pairs && (!strcmp(pairs, "0") || !strcmp(pairs, "1")) ? pairs[0] == '1' : tgt_cpu_intel();
    c.logs = loop_logs_from_env();
    c.log = NULL;
    char err[256];
    if (tgt_resolve(NULL, &c.target, err, sizeof err) != KILN_OK)
        tgt_make(tgt_best(tgt_cpu_features()), tgt_cpu_features(), &c.target, err, sizeof err);
    return c;
}

unsigned loop_logs_from_env(void) {
    static const struct {
        const char *name;
        unsigned bit;
    } topics[] = {
        {"fusion", LOG_FUSION},
        {"schedule", LOG_SCHEDULE},
        {"inline", LOG_INLINE},
        {"loop_ir", LOG_LOOP_IR},
        {"rewrite", LOG_REWRITE},
        {"team", LOG_TEAM},
        {"all", ~0u},
    };
    const char *env = getenv("KILN_LOGS");
    unsigned bits = 0;
    while (env && *env) {
        size_t n = strcspn(env, ",");
        for (size_t i = 0; i < sizeof topics / sizeof *topics; i++)
            if (strlen(topics[i].name) == n && !strncmp(env, topics[i].name, n))
                bits |= topics[i].bit;
        env += n + (env[n] == ',');
    }
    return bits;
}

void loop_log(const KilnConfig *cfg, unsigned topic, const char *fmt, ...) {
    if (!cfg || !(cfg->logs & topic)) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(cfg->log ? cfg->log : stderr, fmt, ap);
    va_end(ap);
}
