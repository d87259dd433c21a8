/*
 * test_regress.c -- the regression inputs of tests/regress/ (crashes and
 * edge cases the fuzzers found or probe).
 *
 * Each file there is an input that once crashed kiln or sits at an edge
 * the fuzzers probe: deep nesting, a long line under the caret, NUL and
 * CR bytes, header lengths that lie, shapes whose byte count overflows.
 * tests/regress/expect.txt says, per file, the status kiln_parse_file or
 * kiln_npy_read must return and a piece of the message. Every file in the
 * directory must have its line, so a crash input cannot be dropped in
 * without saying what kiln should do with it. A .kiln file that parses is
 * also run by the interpreter (on zeros), as the fuzzer does.
 */
#include "test.h"
#include <dirent.h>
#include <stdbool.h>

#define MAX_ENTRIES 256

typedef struct {
    char file[128];
    int status;
    char text[512];
} Entry;

static int load_expect(const char *dir, Entry *e, int max) {
    char path[512], line[1024];
    snprintf(path, sizeof path, "%s/expect.txt", dir);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        int used = 0;
        if (line[0] == '#' || !line[0]) continue;
        if (sscanf(line, "%127s %d %n", e[n].file, &e[n].status, &used) < 2 || !used) continue;
        snprintf(e[n].text, sizeof e[n].text, "%s", line + used);
        n++;
    }
    fclose(f);
    return n;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* Interpret a parsed program on zero inputs; its status. */
static kiln_status interpret_zeros(kiln_graph *g) {
    kiln_tensor in[16] = {{0}}, out[16] = {{0}};
    int nin = kiln_num_inputs(g), nout = kiln_num_outputs(g);
    if (nin > 16 || nout > 16) return KILN_OK;
    kiln_status st = KILN_OK;
    for (int i = 0; i < nin && st == KILN_OK; i++) {
        in[i] = kiln_input_desc(g, i);
        st = kiln_tensor_alloc(&in[i]);
        if (st == KILN_OK)
            memset(in[i].data, 0, (size_t)kiln_tensor_numel(&in[i]) * kiln_dtype_size(in[i].dtype));
    }
    if (st == KILN_OK) st = kiln_interpret(g, in, out);
    for (int i = 0; i < nout && st == KILN_OK; i++) kiln_tensor_free(&out[i]);
    for (int i = 0; i < nin; i++) kiln_tensor_free(&in[i]);
    return st;
}

/* Run one file; its status, and the first line of the message in msg. */
static kiln_status run_file(const char *path, char *msg, size_t len) {
    kiln_status st;
    if (ends_with(path, ".npy")) {
        kiln_tensor t;
        st = kiln_npy_read(path, &t, msg, len);
        if (st == KILN_OK) kiln_tensor_free(&t);
    } else {
        kiln_graph *g = kiln_graph_new();
        if (!g) return KILN_ERR_NOMEM;
        st = kiln_parse_file(g, path);
        snprintf(msg, len, "%s", kiln_error(g));
        if (st == KILN_OK) st = interpret_zeros(g);
        kiln_graph_free(g);
    }
    msg[strcspn(msg, "\n")] = 0;
    return st;
}

TEST(regress_inputs) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/regress", test_srcdir());
    static Entry e[MAX_ENTRIES];
    int n = load_expect(dir, e, MAX_ENTRIES);
    CHECKF(n > 0, "no entries in %s/expect.txt", dir);
    for (int i = 0; i < n; i++) {
        char path[1024], msg[1024] = "";
        snprintf(path, sizeof path, "%s/%.127s", dir, e[i].file);
        kiln_status st = run_file(path, msg, sizeof msg);
        EXPECT((int)st == e[i].status, "%s: status %d, want %d (%s)", e[i].file, (int)st,
               e[i].status, msg);
        EXPECT(strstr(msg, e[i].text) != NULL, "%s: message '%s' lacks '%s'", e[i].file, msg,
               e[i].text);
    }
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        if (de->d_name[0] == '.' || !strcmp(de->d_name, "expect.txt")) continue;
        bool listed = false;
        for (int i = 0; i < n; i++) listed |= !strcmp(e[i].file, de->d_name);
        EXPECT(listed, "%s/%s has no line in expect.txt", dir, de->d_name);
    }
    closedir(d);
}
