/* randprog.h -- random .kiln programs for differential tests (randprog.c). */
#ifndef KILN_RANDPROG_H
#define KILN_RANDPROG_H
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
/* Write the program for `seed` into buf (cap bytes); returns its length. */
size_t randprog(uint64_t seed, char *buf, size_t cap);
/* The same generator with a dim of 0 in about half the inputs. */
size_t randprog_empty(uint64_t seed, char *buf, size_t cap);
/* The same generator with f64 inputs (the first, and others at random). */
size_t randprog_f64(uint64_t seed, char *buf, size_t cap);
#endif
