/*
 * test_profile.c -- the profiler (runtime/profile.c): every call of every
 * profiled run is counted once, its bytes are the schedule's traffic, a
 * matmul's flops are 2 M N K, the calls' time fits in the run's, each
 * thread of a parallel kernel reports its share (a fixed team of 2: two
 * spans per run), and the generated code opens every parallel region with
 * the threads' hooks, and a call on oneDNN names the implementation that
 * ran. KILN_PROFILE takes 0 or 1 and nothing else; KILN_TRACE must name a
 * file that can be made.
 */
#include "test.h"
#include "testutil.h"
#include "runtime/runtime.h"

static const char *prof_src = "input x: f32[256, 512]\n"
                              "weight w: f32[512, 128] = randn(3)\n"
                              "y = relu(x @ w)\n"
                              "z = sum(exp(y * 0.5), 1)\n"
                              "s = tanh(x) + 1\n"
                              "output z, s\n";

static kiln_graph *prof_graph(void) {
    test_use_shared_cache();
    kiln_graph *g = kiln_graph_new();
    if (kiln_parse(g, prof_src, "profile.kiln") != KILN_OK) printf("  %s\n", kiln_error(g));
    return g;
}

static int count_of(const char *text, const char *what) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)); p += strlen(what)) n++;
    return n;
}

TEST(profile_counts_every_call) {
    kiln_graph *g = prof_graph();
    kiln_options o = kiln_default_options();
    o.threads = 2;
    o.fixed_threads = 1;
    kiln_program *p = NULL;
    CHECKF(kiln_compile_with(g, &o, &p) == KILN_OK, "%s", kiln_error(g));
    RtProgram *rp = kiln_program_rt(p);
    CHECK(rt_set_profile(rp, true, true) == KILN_OK);
    kiln_tensor in = kiln_input_desc(g, 0), out[2];
    CHECK(kiln_tensor_alloc(&in) == KILN_OK);
    kiln_fill_randn(in.data, kiln_tensor_numel(&in), 4);
    for (int i = 0; i < 2; i++) {
        out[i] = kiln_output_desc(g, i);
        CHECK(kiln_tensor_alloc(&out[i]) == KILN_OK);
    }
    enum { RUNS = 3 };
    for (int r = 0; r < RUNS; r++) CHECK(kiln_program_run_into(p, &in, out) == KILN_OK);
    const RtProf *pr = rt_profile(rp);
    const CgOutput *code = rt_code(rp);
    const Schedule *s = rt_schedule(rp);
    EXPECT(prof_runs(pr) == RUNS, "runs %lld", (long long)prof_runs(pr));
    double calls_ms = 0;
    int parallel = 0, mm = 0, dnnl = 0;
    for (int c = 0; c < code->ncalls; c++) {
        const RtProfCall *pc = prof_call(pr, c);
        const Kernel *k = &s->kernels[code->calls[c].kernel];
        CHECK(pc != NULL);
        EXPECT(pc->count == RUNS, "call %d counted %lld times", c, (long long)pc->count);
        EXPECT(pc->bytes == k->load_bytes + k->store_bytes, "call %d: %lld bytes", c,
               (long long)pc->bytes);
        EXPECT(pc->ns > 0, "call %d took no time", c);
        calls_ms += prof_call_ms(pr, c);
        if (code->calls[c].parallel) {
            parallel++;
            EXPECT(pc->busy_ns > 0, "parallel call %d: no thread reported", c);
        } else {
            EXPECT(pc->busy_ns == 0, "call %d is not parallel, yet threads reported", c);
        }
        if (!strcmp(pc->kind, "matmul")) {
            mm++;
            EXPECT(pc->flops == 2.0 * 256 * 128 * 512, "matmul flops %g", pc->flops);
            EXPECT((strstr(pc->path, "epilogue fused") != NULL) == (k->n > 1), "matmul path: %s",
                   pc->path);
            /* the constant w: oneDNN, which names its implementation */
            dnnl += strstr(pc->path, "oneDNN") != NULL;
            EXPECT(!strstr(pc->path, "oneDNN") ||
                       (pc->impl[0] && strcmp(pc->impl, "declined") && strncmp(pc->impl, "ref", 3)),
                   "matmul on oneDNN ran '%s'", pc->impl);
        }
        if (k->kind != KK_EXTERN)
            EXPECT(!pc->impl[0], "generated call %d: implementation '%s'", c, pc->impl);
    }
    EXPECT(mm == 1 && parallel >= 2, "%d matmul calls, %d parallel", mm, parallel);
    EXPECT(calls_ms <= prof_run_ms(pr) * 1.0001, "calls %.4f ms > run %.4f ms", calls_ms,
           prof_run_ms(pr));
    EXPECT(prof_call(pr, code->ncalls) == NULL, "a call past the last");

    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CHECK(f != NULL);
    prof_trace(pr, f);
    fclose(f);
    int ncall = count_of(text, "\"cat\": \"call\""), nthr = count_of(text, "\"cat\": \"thread\"");
    EXPECT(ncall == RUNS * code->ncalls, "%d call spans for %d calls", ncall, code->ncalls);
    EXPECT(nthr == RUNS * 2 * parallel, "%d thread spans, %d parallel calls on 2 threads", nthr,
           parallel);
    EXPECT(count_of(text, "\"thread_name\"") == 2, "thread tracks:\n%.300s", text);
    free(text);

    text = NULL;
    f = open_memstream(&text, &len);
    CHECK(f != NULL);
    prof_print(pr, f);
    fclose(f);
    for (int c = 0; c < code->ncalls; c++)
        EXPECT(strstr(text, code->calls[c].name) != NULL, "%s not in the profile",
               code->calls[c].name);
    EXPECT(strstr(text, "== by kind") != NULL, "no summary");
    /* oneDNN's implementation, or OpenBLAS where the first call's trial
     * found it faster (matmul_dnnl.c, mm_try) */
    EXPECT(count_of(text, "[oneDNN ran ") + count_of(text, "[OpenBLAS sgemm (faster here)]") ==
               dnnl,
           "the matmul's implementation not printed");
    free(text);

    prof_reset(rt_profile(rp));
    EXPECT(prof_runs(pr) == 0 && prof_call(pr, 0)->count == 0, "reset");
    CHECK(rt_set_profile(rp, false, false) == KILN_OK);
    EXPECT(rt_profile(rp) == NULL, "profiler still on");
    CHECK(kiln_program_run_into(p, &in, out) == KILN_OK); /* runs on without it */
    for (int i = 0; i < 2; i++) kiln_tensor_free(&out[i]);
    kiln_tensor_free(&in);
    kiln_program_free(p);
    kiln_graph_free(g);
}

/* Every parallel region of the generated code calls the threads' hooks,
 * and no `parallel for` is left (it has no place for them). */
TEST(profile_hooks_in_every_parallel_region) {
    kiln_graph *g = prof_graph();
    kiln_program *p = NULL;
    CHECKF(kiln_compile(g, 2, &p) == KILN_OK, "%s", kiln_error(g));
    const CgOutput *code = rt_code(kiln_program_rt(p));
    const char *src = code->source;
    int regions = count_of(src, "#pragma omp parallel\n");
    EXPECT(regions >= 2, "%d parallel regions", regions);
    EXPECT(count_of(src, "KILN_PROF_THREAD_BEGIN);") == regions &&
               count_of(src, "KILN_PROF_THREAD_END);") == regions,
           "hooks in %d regions", regions);
    EXPECT(!strstr(src, "omp parallel for"), "a parallel for without hooks");
    EXPECT(count_of(src, "KILN_PROF_BEGIN);") == code->ncalls &&
               count_of(src, "KILN_PROF_END);") == code->ncalls,
           "call hooks");
    kiln_program_free(p);
    kiln_graph_free(g);
}

TEST(profile_env_takes_0_or_1) {
    kiln_graph *g = prof_graph();
    kiln_program *p = NULL;
    setenv("KILN_PROFILE", "yes", 1);
    kiln_status st = kiln_compile(g, 1, &p);
    unsetenv("KILN_PROFILE");
    EXPECT(st == KILN_ERR_INPUT && p == NULL, "status %d", st);
    EXPECT(strstr(kiln_error(g), "KILN_PROFILE=yes") != NULL, "message: %s", kiln_error(g));
    setenv("KILN_PROFILE", "0", 1);
    st = kiln_compile(g, 1, &p);
    unsetenv("KILN_PROFILE");
    EXPECT(st == KILN_OK && p && !rt_profile(kiln_program_rt(p)), "KILN_PROFILE=0: status %d", st);
    kiln_program_free(p);
    p = NULL;
    /* KILN_TRACE where no file can be made: refused before anything
     * compiles (its file would only be written when the program is freed) */
    static const char *const bad[] = {"/nonexistent-kiln-dir/t.json", "/"};
    for (int i = 0; i < 2; i++) {
        setenv("KILN_TRACE", bad[i], 1);
        st = kiln_compile(g, 1, &p);
        unsetenv("KILN_TRACE");
        EXPECT(st == KILN_ERR_ENV && p == NULL, "KILN_TRACE=%s: status %d", bad[i], st);
        EXPECT(strstr(kiln_error(g), "KILN_TRACE: cannot write") != NULL, "message: %s",
               kiln_error(g));
        kiln_program_free(p);
        p = NULL;
    }
    kiln_graph_free(g);
}
