/*
 * cli.h -- the command line, above everything (not part of libkiln.a).
 *
 *   main.c       the kiln command: run, explain, code, bench, dot, onnx-test
 *   onnx_test.c  the ONNX backend conformance runner behind onnx-test (and
 *                the tests' conformance list)
 */
#ifndef KILN_CLI_H
#define KILN_CLI_H

#include "front/front.h"
#include "runtime/runtime.h"

/* ---- onnx_test.c ---- */
typedef enum { OXT_PASS, OXT_FAIL, OXT_UNSUPPORTED } OxTestVerdict;
/* Run one backend test directory (model.onnx, test_data_set_N/). why
 * receives the reason for a failure or an unsupported verdict. */
OxTestVerdict ox_run_test(const char *dir, const kiln_options *opt, bool also_interp, char *why,
                          size_t whylen);

#endif
