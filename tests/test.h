/*
 * test.h -- a tiny test framework. Each TEST registers itself at start-up;
 * test_main.c runs them all (or those whose name contains an argument) and
 * prints "PASS: name" or "FAIL: name" lines that tests/run.sh counts.
 */
#ifndef KILN_TEST_H
#define KILN_TEST_H
#include "kiln.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*test_fn)(void);
void test_register(const char *name, test_fn fn);
/* Record a failure of the running test with a message. */
void test_failf(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
extern int test_failed; /* set when the running test failed */
/* A scratch directory for this test run (created on demand). */
const char *test_tmpdir(void);
/* Directory holding the test sources (for golden data): "tests". */
const char *test_srcdir(void);

#define TEST(name)                                                                            \
    static void name(void);                                                                   \
    __attribute__((constructor)) static void reg_##name(void) { test_register(#name, name); } \
    static void name(void)

#define CHECK(cond)                                      \
    do {                                                 \
        if (!(cond)) {                                   \
            test_failf(__FILE__, __LINE__, "%s", #cond); \
            return;                                      \
        }                                                \
    } while (0)
#define CHECKF(cond, ...)                                \
    do {                                                 \
        if (!(cond)) {                                   \
            test_failf(__FILE__, __LINE__, __VA_ARGS__); \
            return;                                      \
        }                                                \
    } while (0)
/* Like CHECK but keeps going (for loops over many cases). */
#define EXPECT(cond, ...)                                         \
    do {                                                          \
        if (!(cond)) test_failf(__FILE__, __LINE__, __VA_ARGS__); \
    } while (0)
#endif
