/* test_main.c -- runs the registered tests (or those whose name contains
 * one of the arguments); see test.h. */
#include "test.h"
#include <stdarg.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_TESTS 1024
static struct {
    const char *name;
    test_fn fn;
} tests[MAX_TESTS];
static int ntests;
int test_failed;
static const char *current;

void test_register(const char *name, test_fn fn) {
    if (ntests < MAX_TESTS) {
        tests[ntests].name = name;
        tests[ntests].fn = fn;
        ntests++;
    }
}

void test_failf(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stdout, "  %s:%d: %s: ", file, line, current);
    vfprintf(stdout, fmt, ap);
    fputc('\n', stdout);
    va_end(ap);
    test_failed = 1;
}

const char *test_tmpdir(void) {
    static char dir[256];
    if (!dir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/kiln-test-%d", base ? base : "/tmp", (int)getpid());
        mkdir(dir, 0755);
    }
    return dir;
}

const char *test_srcdir(void) {
    const char *d = getenv("KILN_TEST_SRCDIR");
    return d ? d : "tests";
}

static int cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Is the test named by one of the filters? A filter is a substring of the
 * name, or with a leading '^' a prefix ("^golden_" leaves out
 * "fused_golden_cases"). */
static int selected(const char *name, int n, char **filters) {
    for (int k = 0; k < n; k++) {
        const char *f = filters[k];
        if (f[0] == '^' ? !strncmp(name, f + 1, strlen(f + 1)) : strstr(name, f) != NULL) return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    int passed = 0, failed = 0;
    (void)cmp;
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 0; i < ntests; i++) {
        if (argc > 1 && !selected(tests[i].name, argc - 1, argv + 1)) continue;
        current = tests[i].name;
        test_failed = 0;
        tests[i].fn();
        printf("%s: %s\n", test_failed ? "FAIL" : "PASS", tests[i].name);
        if (test_failed)
            failed++;
        else
            passed++;
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", test_tmpdir());
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", test_tmpdir());
    printf("unit: %d passed, %d failed\n", passed, failed);
    return failed != 0;
}
