# kiln -- a plain Makefile.
#   make            build/kiln, build/libkiln.a and build/libkiln.so
#   make test       installs missing Debian packages, builds, runs the tests
#                   in a normal build and in an ASan+UBSan build
#   make demo       builds and runs the showcase in examples/
#   make asan       the test suite under ASan+UBSan only
#   make install PREFIX=/usr/local   kiln, kiln.h, libkiln.a, libkiln.so
#                   (soname libkiln.so.0) and kiln.pc
#   make fuzz-parse, make fuzz-npy, make fuzz-onnx   libFuzzer (clang) on the
#                   parser, the .npy reader and the ONNX importer; FUZZ_ARGS
#                   (default -runs=1000000) is passed on
#   make valgrind   memcheck over test_kiln (VALGRIND_FILTER picks the tests)
#   make conformance  the ONNX backend tests of libonnx-testdata;
#                   summary in docs/conformance.md
#   make models     resnet18, mobilenet_v2 and a transformer encoder layer
#                   exported by PyTorch, run by kiln, compared with PyTorch
#   make format     clang-format (.clang-format) over the C sources; make format-check
#                   lists the files that differ
CC      ?= cc
BUILD   ?= build
CFLAGS  ?= -O2 -g
PREFIX  ?= /usr/local
# kiln's version (kiln.pc); the soname's number changes when the ABI does.
VERSION     = 0.1.0
SONAME      = libkiln.so.0
SONAME_FULL = libkiln.so.$(VERSION)
SAN     ?=
# OpenBLAS, the OpenMP build (see src/externs/matmul.c for why), found by its
# multiarch path so the pthread build selected by update-alternatives is
# not picked up by accident; rpath makes the run-time choice the same.
MULTIARCH := $(shell $(CC) -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
BLAS_DIR  = /usr/lib/$(MULTIARCH)/openblas-openmp
BLAS_INC  = -I/usr/include/$(MULTIARCH)/openblas-openmp
KCFLAGS  = -std=c11 -Wall -Wextra -Iinclude -Isrc -I$(BUILD)/gen -D_GNU_SOURCE -fopenmp $(BLAS_INC) $(CFLAGS) $(SAN)
# oneDNN (Debian's libdnnl-dev) for conv2d, see src/externs/conv_dnnl.c.
DNNL_LIBS = -ldnnl
LDLIBS   = -L$(BLAS_DIR) -Wl,-rpath,$(BLAS_DIR) -lopenblas $(DNNL_LIBS) -lprotobuf-c -lm -ldl
ASAN_FLAGS = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

# One folder per stage of the pipeline (docs/design.md); src/cli is the
# command line, not part of the library.
LIBSRC  = $(filter-out src/cli/%,$(wildcard src/*/*.c))
CLISRC  = $(wildcard src/cli/*.c)
CLIOBJ  = $(CLISRC:src/%.c=$(BUILD)/obj/%.o)
LIBOBJ  = $(LIBSRC:src/%.c=$(BUILD)/obj/%.o) $(BUILD)/obj/onnx.pb-c.o
# The test build: the files that hold test hooks (src/testing.h) compiled
# again with -DKILN_TESTING, in place of their objects, into
# libkiln_testing.a; libkiln.a and kiln have no hooks.
HOOKSRC = $(shell grep -l 'ifdef KILN_TESTING' $(LIBSRC))
HOOKOBJ = $(HOOKSRC:src/%.c=$(BUILD)/hobj/%.o)
TLIBOBJ = $(filter-out $(HOOKSRC:src/%.c=$(BUILD)/obj/%.o),$(LIBOBJ)) $(HOOKOBJ)
TESTSRC = $(wildcard tests/test_*.c) tests/randprog.c tests/testutil.c
TESTOBJ = $(TESTSRC:tests/%.c=$(BUILD)/tobj/%.o)
HDRS    = include/kiln.h src/graph/ops.def $(wildcard src/*/*.h)

.PHONY: FORCE all test asan tsan demo install deps clean format format-check check-tests fuzz-diff fuzz-parse fuzz-npy fuzz-onnx fuzz-deps valgrind conformance models
all: $(BUILD)/kiln $(BUILD)/libkiln.a $(BUILD)/$(SONAME_FULL)

# The library's objects are position-independent, so the same objects make
# libkiln.a and libkiln.so (-fno-semantic-interposition: calls inside the
# library stay direct).
# The objects depend on their flags (a build directory from before -fPIC,
# or another CFLAGS, recompiles instead of failing to link).
PIC = -fPIC -fno-semantic-interposition
OBJ_FLAGS = $(BUILD)/obj/.flags
$(OBJ_FLAGS): FORCE
	@mkdir -p $(dir $@)
	@echo '$(CC) $(KCFLAGS) $(PIC)' | cmp -s - $@ || echo '$(CC) $(KCFLAGS) $(PIC)' > $@
FORCE:
$(BUILD)/obj/%.o: src/%.c $(HDRS) $(OBJ_FLAGS)
	@mkdir -p $(dir $@)
	$(CC) $(KCFLAGS) $(PIC) -c $< -o $@

$(BUILD)/hobj/%.o: src/%.c $(HDRS) src/testing.h
	@mkdir -p $(dir $@)
	$(CC) $(KCFLAGS) -DKILN_TESTING -c $< -o $@

$(BUILD)/tobj/%.o: tests/%.c tests/test.h tests/randprog.h tests/testutil.h $(HDRS) src/testing.h
	@mkdir -p $(dir $@)
	$(CC) $(KCFLAGS) -DKILN_TESTING -c $< -o $@

# The headers the prelude of every generated source pastes, vecmath.h and
# kiln_rt.h (the interface the generated code shares with the runtime), as
# C string literals, so a cached or installed kiln needs no source tree
# ('?' escaped: trigraphs).
EMBED = sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/?/\\?/g' -e 's/^/"/' -e 's/$$/\\n"/'
$(BUILD)/gen/vecmath_src.inc: src/codegen/vecmath.h
	@mkdir -p $(dir $@)
	$(EMBED) $< > $@
$(BUILD)/gen/kiln_rt_src.inc: src/base/kiln_rt.h
	@mkdir -p $(dir $@)
	$(EMBED) $< > $@
$(BUILD)/obj/codegen/codegen.o: $(BUILD)/gen/vecmath_src.inc $(BUILD)/gen/kiln_rt_src.inc

# ONNX: the protobuf-c reader of onnx.proto is generated at build
# time from the copy Debian's libonnx-dev ships; no hand-written decoder.
# Generated code is not ours to warn about (-w).
ONNX_PROTO ?= /usr/include/onnx/onnx.proto
%/gen/onnx.pb-c.c: $(ONNX_PROTO)
	@mkdir -p $(dir $@)
	cp $< $(dir $@)onnx.proto
	cd $(dir $@) && protoc-c --c_out=. onnx.proto
%/gen/onnx.pb-c.h: %/gen/onnx.pb-c.c
	@true
$(BUILD)/obj/onnx.pb-c.o: $(BUILD)/gen/onnx.pb-c.c $(OBJ_FLAGS)
	@mkdir -p $(dir $@)
	$(CC) $(KCFLAGS) $(PIC) -w -c $< -o $@
$(LIBSRC:src/%.c=$(BUILD)/obj/%.o) $(HOOKOBJ) $(TESTOBJ) $(CLIOBJ): $(BUILD)/gen/onnx.pb-c.h

$(BUILD)/libkiln.a: $(LIBOBJ)
	@rm -f $@
	ar rcs $@ $^

# The shared library (below) records its dependencies (OpenBLAS with its
# rpath, oneDNN, protobuf-c, libm, libgomp), so `-lkiln` alone links; only
# kiln_* is exported (kiln.map).
$(BUILD)/$(SONAME_FULL): $(LIBOBJ) kiln.map
	$(CC) $(KCFLAGS) -shared -Wl,-soname,$(SONAME) -Wl,--version-script,kiln.map -Wl,-z,defs \
	    -o $@ $(LIBOBJ) $(LDLIBS)
	ln -sf $(SONAME_FULL) $(BUILD)/$(SONAME)
	ln -sf $(SONAME) $(BUILD)/libkiln.so

$(BUILD)/libkiln_testing.a: $(TLIBOBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/kiln: $(CLIOBJ) $(BUILD)/libkiln.a
	$(CC) $(KCFLAGS) -o $@ $^ $(LDLIBS)

# The tests also run the conformance runner (src/cli/onnx_test.c).
$(BUILD)/test_kiln: $(TESTOBJ) $(BUILD)/obj/cli/onnx_test.o $(BUILD)/libkiln_testing.a
	$(CC) $(KCFLAGS) -o $@ $^ $(LDLIBS)

# Random programs, fused vs interpreter, fresh seeds until stopped (Ctrl-C);
# a failing program is saved under fuzz-out/.
fuzz-diff: $(BUILD)/fuzz_diff
	$(BUILD)/fuzz_diff -o fuzz-out

$(BUILD)/fuzz_diff: $(BUILD)/tobj/fuzz_diff.o $(BUILD)/tobj/randprog.o $(BUILD)/libkiln_testing.a
	$(CC) $(KCFLAGS) -o $@ $^ $(LDLIBS)

deps:
	@sh scripts/deps.sh

# Both builds run, one summary line at the end.
test: deps
	@$(MAKE) --no-print-directory $(BUILD)/kiln $(BUILD)/test_kiln
	@$(MAKE) --no-print-directory BUILD=$(BUILD)/asan SAN="$(ASAN_FLAGS)" CFLAGS="-O1 -g" $(BUILD)/asan/kiln $(BUILD)/asan/test_kiln
	@KILN_TEST_CACHE_DIR=$(CURDIR)/$(BUILD)/test-jit-cache sh tests/run.sh $(BUILD) $(BUILD)/asan

asan: deps
	@$(MAKE) --no-print-directory BUILD=$(BUILD)/asan SAN="$(ASAN_FLAGS)" CFLAGS="-O1 -g" $(BUILD)/asan/kiln $(BUILD)/asan/test_kiln
	@sh tests/run.sh $(BUILD)/asan

# ThreadSanitizer (clang) over the tests of one program shared by threads
# (tests/test_serve.c) and the other concurrency tests (test_team.c's
# concurrent callers, whose runs share the team-size state). clang compiles kiln
# against libgomp, the OpenMP runtime OpenBLAS and oneDNN use, which TSan
# does not see into (-fopenmp=libgomp: kiln's own pragmas are then ignored,
# so each run is one thread and every thread TSan sees is a caller's); the
# JIT-compiled kernels are not instrumented.
TSAN_FLAGS = -fsanitize=thread -fno-omit-frame-pointer
TSAN_TESTS ?= serve team_concurrent
tsan: deps
	@$(MAKE) --no-print-directory BUILD=$(BUILD)/tsan CC=clang SAN="$(TSAN_FLAGS) -fopenmp=libgomp" \
	    CFLAGS="-O1 -g -Wno-unknown-pragmas -Wno-unused-command-line-argument" $(BUILD)/tsan/test_kiln
	@TSAN_OPTIONS="halt_on_error=1 suppressions=$(CURDIR)/tests/tsan.supp" \
	    KILN_TEST_CACHE_DIR=$(CURDIR)/$(BUILD)/test-jit-cache $(BUILD)/tsan/test_kiln $(TSAN_TESTS)

demo: deps
	@$(MAKE) --no-print-directory all
	@sh examples/demo.sh $(BUILD)/kiln

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include
	install -m 755 $(BUILD)/kiln $(DESTDIR)$(PREFIX)/bin/kiln
	install -m 644 $(BUILD)/libkiln.a $(DESTDIR)$(PREFIX)/lib/libkiln.a
	install -m 755 $(BUILD)/$(SONAME_FULL) $(DESTDIR)$(PREFIX)/lib/$(SONAME_FULL)
	ln -sf $(SONAME_FULL) $(DESTDIR)$(PREFIX)/lib/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(PREFIX)/lib/libkiln.so
	install -m 644 include/kiln.h $(DESTDIR)$(PREFIX)/include/kiln.h
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' -e 's|@BLAS_DIR@|$(BLAS_DIR)|g' \
	    -e 's|@DNNL_LIBS@|$(DNNL_LIBS)|g' kiln.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/kiln.pc

clean:
	rm -rf $(BUILD)

# The formatter (.clang-format; Debian's clang-format). Not part of make test.
FORMAT_SRC = $(filter-out src/codegen/vecmath.h,$(shell git ls-files 'src/*.[ch]' 'tests/*.[ch]' 'bench/*.[ch]' 'fuzz/*.c'))
format:
	clang-format -i $(FORMAT_SRC)
format-check:
	@clang-format --dry-run $(FORMAT_SRC) 2>&1 | grep -o '^[^:]*' | sort -u; true

# ---- fuzzing --------------------------------------------------------------
# libFuzzer harnesses in fuzz/, built with clang under ASan+UBSan into
# $(BUILD)/fuzz with the whole library (the harnesses reach the parser, the
# .npy reader and the interpreter; the rest is linked, never run). The seed
# corpus is every example, golden program, .npy fixture and tests/regress
# file; new inputs go to $(BUILD)/fuzz/corpus-*, crashes to
# $(BUILD)/fuzz/crash-*. Example: make fuzz-parse FUZZ_ARGS=-max_total_time=60
FUZZ_CC    ?= clang
FUZZ_ARGS  ?= -runs=1000000
FUZZ_DIR    = $(BUILD)/fuzz
FUZZ_CFLAGS = -std=c11 -g -O1 -Iinclude -Isrc -I$(FUZZ_DIR)/gen -D_GNU_SOURCE -fopenmp $(BLAS_INC) \
              -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_LIB    = $(LIBSRC:src/%.c=$(FUZZ_DIR)/obj/%.o) $(FUZZ_DIR)/obj/onnx.pb-c.o
.SECONDARY: $(FUZZ_LIB) $(BUILD)/gen/onnx.pb-c.c $(BUILD)/gen/onnx.pb-c.h $(FUZZ_DIR)/gen/onnx.pb-c.c $(FUZZ_DIR)/gen/onnx.pb-c.h

$(FUZZ_DIR)/obj/%.o: src/%.c $(HDRS) $(FUZZ_DIR)/gen/onnx.pb-c.h
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_DIR)/obj/onnx.pb-c.o: $(FUZZ_DIR)/gen/onnx.pb-c.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -w -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_DIR)/fuzz_%: fuzz/fuzz_%.c $(FUZZ_LIB) $(HDRS)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_LIB) $(LDLIBS)

fuzz-deps:
	@sh scripts/deps.sh clang

$(FUZZ_LIB) $(FUZZ_DIR)/fuzz_parse $(FUZZ_DIR)/fuzz_npy $(FUZZ_DIR)/fuzz_onnx: | fuzz-deps

fuzz-parse: $(FUZZ_DIR)/fuzz_parse
	@rm -rf $(FUZZ_DIR)/seed-parse && mkdir -p $(FUZZ_DIR)/seed-parse $(FUZZ_DIR)/corpus-parse
	@for f in examples/*.kiln tests/golden/cases/*/prog.kiln tests/regress/*.kiln; do \
	    [ -f "$$f" ] && cp "$$f" "$(FUZZ_DIR)/seed-parse/$$(echo "$$f" | tr / _)"; done; true
	cd $(FUZZ_DIR) && ./fuzz_parse -dict=$(CURDIR)/fuzz/kiln.dict -artifact_prefix=crash-parse- \
	    $(FUZZ_ARGS) corpus-parse seed-parse

# fuzz-onnx: the ONNX importer; seeds: tests/onnx and a sample of
# libonnx-testdata's node tests.
fuzz-onnx: $(FUZZ_DIR)/fuzz_onnx
	@rm -rf $(FUZZ_DIR)/seed-onnx && mkdir -p $(FUZZ_DIR)/seed-onnx $(FUZZ_DIR)/corpus-onnx
	@for f in $$(find tests/onnx -name '*.onnx') $$(ls -d $(ONNX_DATA)/node/test_* 2>/dev/null | \
	    awk 'NR % 8 == 0' | sed 's|$$|/model.onnx|'); do \
	    [ -f "$$f" ] && cp "$$f" "$(FUZZ_DIR)/seed-onnx/$$(echo "$$f" | tr / _)"; done; true
	cd $(FUZZ_DIR) && ./fuzz_onnx -artifact_prefix=crash-onnx- $(FUZZ_ARGS) corpus-onnx seed-onnx

fuzz-npy: $(FUZZ_DIR)/fuzz_npy
	@rm -rf $(FUZZ_DIR)/seed-npy && mkdir -p $(FUZZ_DIR)/seed-npy $(FUZZ_DIR)/corpus-npy
	@cp tests/npy/*.npy $(FUZZ_DIR)/seed-npy/
	@for f in tests/regress/*.npy; do [ -f "$$f" ] && cp "$$f" $(FUZZ_DIR)/seed-npy/; done; true
	cd $(FUZZ_DIR) && ./fuzz_npy -dict=$(CURDIR)/fuzz/npy.dict -artifact_prefix=crash-npy- \
	    $(FUZZ_ARGS) corpus-npy seed-npy

# ---- benchmarks (not tests) ------------------------------------------------
# make bench-conv: ext_conv2d (oneDNN, and im2col + sgemm, 1x1, depthwise) on ResNet-18
# layer shapes at 1 and 2 threads, in GFLOP/s, with oneDNN called directly
# beside them. BENCH_ARGS is passed on, e.g.
# make bench-conv BENCH_ARGS="--batch 1 --threads 1 --only layer1"
.PHONY: bench-conv
$(BUILD)/bench/conv_bench: bench/conv_bench.c $(BUILD)/libkiln_testing.a $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(KCFLAGS) -DKILN_TESTING -DKILN_BENCH_DNNL -o $@ $< $(BUILD)/libkiln_testing.a $(LDLIBS)

bench-conv: $(BUILD)/bench/conv_bench
	$(BUILD)/bench/conv_bench $(BENCH_ARGS)

# ---- valgrind -------------------------------------------------------------
# memcheck over the normal build's test_kiln: no invalid access, no definite
# leak. VALGRIND_FILTER picks the tests (substrings of their names, or
# prefixes with a leading ^). The default covers the library's own code:
# parser, .npy, interpreter (and golden data), lowering, scheduler,
# rewrites, the regression inputs and the allocation-failure test (about
# 70 s on 2 cores). It leaves out the tests that run JIT-compiled kernels
# (fused, codegen, jit, externs, vecmath, the compiled alloc tests): those
# are built with -march=native, valgrind does not decode AVX-512 (SIGILL),
# and they are slow under it.
VALGRIND_FILTER ?= ^parse_ ^npy_ ^interp_ ^golden_ ^lower_ ^sched_ ^rewrite_ \
                   ^regress_ ^alloc_fail_each_interpret
VALGRIND = valgrind -q --leak-check=full --errors-for-leak-kinds=definite \
           --show-leak-kinds=definite --error-exitcode=1

# ---- ONNX conformance -------------------------------------------------------
# Every test of the four backend-test folders of libonnx-testdata, compiled
# (fused) and compared with ONNX's tolerances; counts per folder and each
# failure. The JIT cache ($(BUILD)/conformance-cache) makes a rerun fast.
ONNX_DATA ?= /usr/share/libonnx-testdata/data
CONFORMANCE_ARGS ?=
conformance: deps $(BUILD)/kiln
	KILN_CACHE_DIR=$(CURDIR)/$(BUILD)/conformance-cache $(BUILD)/kiln onnx-test $(CONFORMANCE_ARGS) \
	    $(ONNX_DATA)/node $(ONNX_DATA)/pytorch-converted $(ONNX_DATA)/pytorch-operator $(ONNX_DATA)/simple

# ---- real models (not part of make test) -------------------------------------
# resnet18, mobilenet_v2 and a transformer encoder layer exported to ONNX by
# Debian's PyTorch (random weights, models/export.py, into $(BUILD)/models),
# run by kiln and compared with PyTorch's output; `kiln explain` must show the
# Conv-BN folds and fused epilogues (models/check.sh).
models: $(BUILD)/kiln
	@sh scripts/deps.sh python3-torch python3-torchvision python3-numpy python3-protobuf protobuf-compiler
	sh models/check.sh $(BUILD)/kiln $(BUILD)/models

# kiln beside ONNX Runtime (PyPI, in the venv models/real.py makes) on the
# exported models at batch 1 and 8 and the real models, 1 and 2 threads,
# side by side in turns (bench/models.py; BENCH_ARGS="--quick", "--only
# resnet18", "--profile DIR" for both peers' per-op profiles).
.PHONY: bench-models
bench-models: $(BUILD)/kiln
	@sh scripts/deps.sh python3-torch python3-torchvision python3-numpy python3-protobuf protobuf-compiler python3-venv
	/usr/bin/python3 bench/models.py --kiln $(BUILD)/kiln $(BENCH_ARGS)

valgrind:
	@sh scripts/deps.sh valgrind
	@$(MAKE) --no-print-directory $(BUILD)/test_kiln
	$(VALGRIND) $(BUILD)/test_kiln $(VALGRIND_FILTER)

# bench/serve: one compiled program shared by caller threads (throughput,
# p50/p99 latency, resident memory over time); bench/serve.sh runs the
# comparisons docs/benchmarks.md reports. Built on the public API only.
$(BUILD)/bench/serve: bench/serve.c $(BUILD)/libkiln.a include/kiln.h
	@mkdir -p $(dir $@)
	$(CC) $(KCFLAGS) -o $@ $< $(BUILD)/libkiln.a $(LDLIBS)
