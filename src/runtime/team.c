/*
 * team.c -- how many threads each run of a program uses, by measurement.
 *
 * A program compiled for T threads runs its kernels and library calls on
 * an OpenMP team of T, on cores kiln does not own. When another process
 * keeps a core busy, one thread of the team shares that core, and every
 * parallel loop of the run ends waiting for it: the scheduler gives the
 * two threads on that core slices of milliseconds, and libgomp's waiting
 * threads spin (about 3 ms by default), so they look busy to the scheduler
 * too. On 2 cores with one busy, bench/serve_mlp.kiln took 3.85 ms per run
 * on 2 threads (p90 12 ms) against 0.22 ms on 1 (docs/decisions.md: team
 * size by measurement). libgomp reads its wait policy once, when it loads,
 * so a library cannot choose it; and even passive waiting left that run at
 * 1.5x the 1-thread time.
 *
 * So the team size of a run is chosen by measuring. A program's levels are
 * T, T - 1, ceil(T / 2) and 1 (those that differ), level 0 the program's
 * count. Runs come in epochs: an epoch runs one level for as many runs as
 * take RT_TEAM_EPOCH_MS at its estimate, RT_TEAM_PROBE_MS when it measures
 * a level that is not the fastest (at least 2 runs; counted, not timed,
 * so that a slow run does not end its epoch sooner and weigh more; a
 * level's first epoch runs until RT_TEAM_FIRST_MS, so that every level has
 * been measured within a few milliseconds of the first run; any epoch
 * ends at 4 times its time), and its mean run time becomes that level's
 * estimate. The
 * next epoch runs a level not yet measured if there is one, else the level
 * with the lowest estimate, except that another level is measured again
 * once the run time since its last epoch reaches `wait` times what an
 * epoch of it would cost over the best (RT_TEAM_EPOCH_MS times 1 - best /
 * its estimate, four times a probe's own cost, plus two changes of team
 * size, below; or what its last epoch cost beyond the fastest's time for as
 * many runs, settling runs included, plus one change, if that was more:
 * a probe of a level that collapses ends early but its slow settling runs
 * still cost). A level's wait starts at RT_TEAM_EXPLORE_FIRST, doubles
 * each time it is measured again and is still slower, up to
 * RT_TEAM_EXPLORE, and starts again when the level is the fastest or was
 * until its last epoch: so measuring again costs at most 1/RT_TEAM_EXPLORE
 * of the run time once the waits have grown (4 more epochs before), an
 * estimate spoilt by a passing stall is measured again soon, and a level
 * that was slow because of a load that has gone is back within
 * RT_TEAM_EXPLORE such costs. An epoch ends early when 4 runs in a row
 * take more than twice another level's estimate, and its estimate is then
 * the recent runs' moving average (weight 1/4): a collapse that starts in
 * the middle of an epoch is left within a few runs, while one slow run
 * among fast ones only adds its time to the epoch's mean.
 * The first RT_TEAM_SETTLE runs of an epoch on a team size other than the
 * last epoch's are not measured: the first run at a size wakes threads
 * that slept (on 2 cores, 0.5-1.4 ms for a 0.12 ms layernorm) and the next
 * ones find their data in the other core's cache (1 thread: 0.3-0.5 ms
 * against 0.25); the first run at a size ever also makes oneDNN's
 * primitives for it. What they took beyond the level's mean is the cost of
 * a change of size, switch_ms, and a measurement again counts two changes
 * in its cost (above).
 *
 * The clock is run time summed over runs, not the wall clock: a server
 * idle between requests has not run anything, and concurrent runs each
 * add theirs. Runs whose level is not the current epoch's (they started
 * before the epoch changed) are counted but not measured.
 *
 * Fixed (kiln_options.fixed_threads): one level, every run on T threads.
 * The functions here only do the arithmetic; the caller serializes them
 * (runtime.c holds the program's pool lock) and times the runs.
 */
#include "runtime/runtime.h"
#include <string.h>

void rt_team_init(RtTeam *t, int threads, bool fixed) {
    memset(t, 0, sizeof *t);
    int want[RT_TEAM_LEVELS] = {threads, threads - 1, (threads + 1) / 2, 1};
    t->size[0] = threads > 0 ? threads : 0;
    t->nlevels = 1;
    for (int i = 1; i < RT_TEAM_LEVELS && !fixed && threads > 1; i++) {
        bool seen = want[i] < 1;
        for (int j = 0; j < t->nlevels; j++) seen |= t->size[j] == want[i];
        if (!seen) t->size[t->nlevels++] = want[i];
    }
    for (int i = 0; i < RT_TEAM_LEVELS; i++) {
        t->est[i] = -1;
        t->wait[i] = RT_TEAM_EXPLORE_FIRST;
    }
    t->settle = RT_TEAM_SETTLE;
}

int rt_team_pick(const RtTeam *t) { return t->cur; }

/* The run time of level l's epoch in progress: a first, a probe of a
 * level that is not the fastest, or the fastest's. */
static double epoch_ms(const RtTeam *t, int l) {
    return t->est[l] < 0 ? RT_TEAM_FIRST_MS : t->probe ? RT_TEAM_PROBE_MS : RT_TEAM_EPOCH_MS;
}

/* The runs of an epoch of ms at est ms per run. */
static int team_runs(double ms, double est) {
    double n = ms / (est > 1e-6 ? est : 1e-6);
    return n < 2 ? 2 : n > 100000 ? 100000 : (int)n;
}

static int team_best(const RtTeam *t) {
    int b = 0;
    for (int l = 1; l < t->nlevels; l++)
        if (t->est[l] >= 0 && (t->est[b] < 0 || t->est[l] < t->est[b])) b = l;
    return b;
}

/* The level of the next epoch (see the header), and why. */
static int team_next(const RtTeam *t, const char **why) {
    *why = "not measured yet";
    for (int l = 0; l < t->nlevels; l++)
        if (t->est[l] < 0) return l;
    int b = team_best(t);
    *why = "measured again";
    for (int l = 0; l < t->nlevels; l++) {
        if (l == b) continue;
        double extra = RT_TEAM_EPOCH_MS * (1 - t->est[b] / t->est[l]) + 2 * t->switch_ms;
        if (t->cost[l] + t->switch_ms > extra) extra = t->cost[l] + t->switch_ms;
        if (t->clock - t->last[l] >= t->wait[l] * extra) return l;
    }
    *why = "the fastest";
    return b;
}

bool rt_team_record(RtTeam *t, int level, double ms) {
    if (level < 0 || level >= t->nlevels) return false;
    t->runs[level]++;
    if (t->nlevels == 1 || ms < 0) return false;
    t->clock += ms;
    if (level != t->cur) return false;
    t->all_ms += ms;
    t->all_runs++;
    if (t->settle > 0) { /* the first runs after a change of team size */
        t->settle--;
        t->settle_ms += ms;
        t->settle_first |= t->runs[level] == 1;
        return false;
    }
    t->recent = t->ecount ? t->recent + (ms - t->recent) / 4 : ms;
    t->ecount++;
    t->esum += ms;
    /* slow: more than twice the best estimate of another level */
    bool slow = false;
    for (int l = 0; l < t->nlevels; l++) slow |= l != level && t->est[l] >= 0 && ms > 2 * t->est[l];
    t->slow = slow ? t->slow + 1 : 0;
    double mean = t->esum / t->ecount, want = epoch_ms(t, level);
    bool early = t->slow >= 4 && t->ecount >= 4;
    /* a measured level's epoch is a count of runs, so that a slow run does
     * not end it sooner (and weigh more); a first epoch is a time */
    bool full = t->est[level] >= 0 ? t->ecount >= team_runs(want, t->est[level])
                                   : t->ecount >= 2 && t->esum >= want;
    if (!early && !full && t->esum < 4 * want) return false;
    int was = team_best(t);
    t->est[level] = early ? t->recent : mean;
    /* what the settling runs took beyond the level's mean: the cost of a
     * change of team size (not from a level's first run ever, which also
     * makes its library state) */
    if (t->settle_ms > 0 && !t->settle_first) {
        double cost = t->settle_ms - RT_TEAM_SETTLE * mean;
        t->switch_ms += ((cost > 0 ? cost : 0) - t->switch_ms) / 2;
    }
    t->last[level] = t->clock;
    /* a level measured again and still slower waits twice as long for its
     * next measurement, up to RT_TEAM_EXPLORE; one that is the fastest, or
     * was until now, starts again from RT_TEAM_EXPLORE_FIRST */
    if (team_best(t) != level && was != level)
        t->wait[level] =
            t->wait[level] * 2 < RT_TEAM_EXPLORE ? t->wait[level] * 2 : RT_TEAM_EXPLORE;
    else
        t->wait[level] = RT_TEAM_EXPLORE_FIRST;
    /* what this epoch took beyond the fastest level's time for its runs,
     * settling runs included: the measured cost of measuring it again */
    int best = team_best(t);
    if (best != level) {
        double over = t->all_ms - t->all_runs * t->est[best];
        t->cost[level] = over > 0 ? over : 0;
    }
    t->all_ms = 0;
    t->all_runs = 0;
    t->done_count = t->ecount;
    t->ecount = 0;
    t->esum = 0;
    t->slow = 0;
    t->cur = team_next(t, &t->why);
    t->probe = t->cur != team_best(t);
    t->settle = t->cur != level ? RT_TEAM_SETTLE : 0;
    t->settle_ms = 0;
    t->settle_first = false;
    return true;
}

int rt_team_size(const RtTeam *t, int level) {
    return level >= 0 && level < t->nlevels ? t->size[level] : t->size[0];
}
