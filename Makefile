# kiln -- a plain Makefile.
#   make            build/kiln and build/libkiln.a
#   make test       installs missing Debian packages, builds, runs the tests
#                   in a normal build and in an ASan+UBSan build
#   make demo       builds and runs the showcase in examples/
#   make asan       the test suite under ASan+UBSan only
#   make install PREFIX=/usr/local
CC      ?= cc
BUILD   ?= build
CFLAGS  ?= -O2 -g
PREFIX  ?= /usr/local
SAN     ?=
# OpenBLAS, the OpenMP build (see src/externs.c for why), found by its
# multiarch path so the pthread build selected by update-alternatives is
# not picked up by accident; rpath makes the run-time choice the same.
MULTIARCH := $(shell $(CC) -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
BLAS_DIR  = /usr/lib/$(MULTIARCH)/openblas-openmp
BLAS_INC  = -I/usr/include/$(MULTIARCH)/openblas-openmp
KCFLAGS  = -std=c11 -Wall -Wextra -Iinclude -Isrc -D_GNU_SOURCE -fopenmp $(BLAS_INC) $(CFLAGS) $(SAN)
LDLIBS   = -L$(BLAS_DIR) -Wl,-rpath,$(BLAS_DIR) -lopenblas -lm -ldl
ASAN_FLAGS = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

LIBSRC  = $(filter-out src/main.c,$(wildcard src/*.c))
LIBOBJ  = $(LIBSRC:src/%.c=$(BUILD)/obj/%.o)
TESTSRC = $(wildcard tests/test_*.c) tests/randprog.c
TESTOBJ = $(TESTSRC:tests/%.c=$(BUILD)/tobj/%.o)
HDRS    = include/kiln.h src/kiln_int.h src/ops.def $(wildcard src/*.h)

.PHONY: all test asan demo install deps clean check-tests
all: $(BUILD)/kiln $(BUILD)/libkiln.a

$(BUILD)/obj/%.o: src/%.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(KCFLAGS) -c $< -o $@

$(BUILD)/tobj/%.o: tests/%.c tests/test.h tests/randprog.h $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(KCFLAGS) -c $< -o $@

$(BUILD)/libkiln.a: $(LIBOBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/kiln: $(BUILD)/obj/main.o $(BUILD)/libkiln.a
	$(CC) $(KCFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/test_kiln: $(TESTOBJ) $(BUILD)/libkiln.a
	$(CC) $(KCFLAGS) -o $@ $^ $(LDLIBS)

deps:
	@sh scripts/deps.sh

# Both builds run, one summary line at the end.
test: deps
	@$(MAKE) --no-print-directory $(BUILD)/kiln $(BUILD)/test_kiln
	@$(MAKE) --no-print-directory BUILD=$(BUILD)/asan SAN="$(ASAN_FLAGS)" CFLAGS="-O1 -g" $(BUILD)/asan/kiln $(BUILD)/asan/test_kiln
	@sh tests/run.sh $(BUILD) $(BUILD)/asan

asan: deps
	@$(MAKE) --no-print-directory BUILD=$(BUILD)/asan SAN="$(ASAN_FLAGS)" CFLAGS="-O1 -g" $(BUILD)/asan/kiln $(BUILD)/asan/test_kiln
	@sh tests/run.sh $(BUILD)/asan

demo: deps
	@$(MAKE) --no-print-directory all
	@sh examples/demo.sh $(BUILD)/kiln

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include
	install -m 755 $(BUILD)/kiln $(DESTDIR)$(PREFIX)/bin/kiln
	install -m 644 $(BUILD)/libkiln.a $(DESTDIR)$(PREFIX)/lib/libkiln.a
	install -m 644 include/kiln.h $(DESTDIR)$(PREFIX)/include/kiln.h
	sed -e 's|@PREFIX@|$(PREFIX)|g' kiln.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/kiln.pc

clean:
	rm -rf $(BUILD)
