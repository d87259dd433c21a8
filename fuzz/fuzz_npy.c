/*
 * fuzz_npy.c -- libFuzzer harness for the .npy reader (make fuzz-npy).
 *
 * kiln_npy_read takes a path, so each input is written to a file of this
 * process's own (under $TMPDIR, else /dev/shm: the writer fsyncs, which
 * costs nothing in memory) and read back. A file that
 * reads is written out again with kiln_npy_write and read a second time:
 * the two tensors must match byte for byte (the writer and the reader
 * agree on everything the reader accepts). A file that does not read must
 * come with a message. The sanitizers report anything else.
 */
#include "kiln.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char in_path[512], out_path[512];

static void remove_files(void) {
    remove(in_path);
    remove(out_path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(in_path, sizeof in_path, "%s/kiln_fuzz_npy.%d.npy", dir, (int)getpid());
    snprintf(out_path, sizeof out_path, "%s/kiln_fuzz_npy.%d.out.npy", dir, (int)getpid());
    setenv("KILN_MEM_LIMIT", "256M", 1);
    atexit(remove_files);
    return 0;
}

static size_t nbytes(const kiln_tensor *t) {
    return (size_t)kiln_tensor_numel(t) * kiln_dtype_size(t->dtype);
}

static void round_trip(const kiln_tensor *t) {
    char err[1024];
    kiln_tensor back;
    if (kiln_npy_write(out_path, t, err, sizeof err) != KILN_OK) {
        if (!err[0]) abort();
        return; /* e.g. a dtype kiln reads but does not write */
    }
    if (kiln_npy_read(out_path, &back, err, sizeof err) != KILN_OK) abort();
    if (back.dtype != t->dtype || back.rank != t->rank ||
        memcmp(back.shape, t->shape, sizeof t->shape[0] * (size_t)t->rank) != 0 ||
        memcmp(back.data, t->data, nbytes(t)) != 0)
        abort();
    kiln_tensor_free(&back);
    remove(out_path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fopen(in_path, "wb");
    if (!f) return 0;
    size_t put = fwrite(data, 1, size, f);
    if (fclose(f) != 0 || put != size) return 0;
    char err[1024];
    kiln_tensor t;
    if (kiln_npy_read(in_path, &t, err, sizeof err) == KILN_OK) {
        round_trip(&t);
        kiln_tensor_free(&t);
    } else if (!err[0] || !strstr(err, in_path)) {
        abort(); /* every failure names the file and says why */
    }
    return 0;
}
