/*
 * kiln.h -- the public C API of kiln, an operator-fusing tensor compiler.
 *
 * A short tour
 * ------------
 * A kiln program is a graph of tensor operations. Build one with the C API
 * (or parse one from the .kiln text format), mark its outputs, and run it:
 *
 *     kiln_graph *g = kiln_graph_new();
 *     int64_t shape[2] = {1024, 1024};
 *     kiln_value x = kiln_input(g, "x", KILN_F32, 2, shape);
 *     kiln_value t = kiln_binary(g, "add", x, kiln_scalar(g, 1.0));
 *     kiln_value y = kiln_unary(g, "sin", kiln_unary(g, "relu", t));
 *     if (y < 0 || kiln_output(g, y, "y") != KILN_OK)
 *         fprintf(stderr, "%s\n", kiln_error(g));
 *
 *     kiln_program *p;                                  // fuse, generate C,
 *     if (kiln_compile(g, 0, &p) != KILN_OK) ...        // compile, load
 *     kiln_tensor in = {KILN_F32, 2, {1024, 1024}, data};
 *     kiln_tensor out[1];
 *     if (kiln_program_run(p, &in, out) != KILN_OK)     // the fused kernels
 *         fprintf(stderr, "%s\n", kiln_program_error(p));
 *     // kiln_interpret(g, &in, ref) runs the unfused reference interpreter
 *     kiln_tensor_free(&out[0]);
 *     kiln_program_free(p);
 *     kiln_graph_free(g);
 *
 * Conventions
 * -----------
 * - Handles are opaque. A graph owns every value built in it and frees them
 *   all in kiln_graph_free.
 * - Builder calls return a kiln_value: an index >= 0, or KILN_NONE (-1) on
 *   failure. A failed call leaves a message in the graph (kiln_error), and any
 *   later call given KILN_NONE as an operand fails too, keeping the first
 *   message, so a chain of calls can be checked once at its end.
 * - Calls that do something other than build return a kiln_status; KILN_OK is
 *   0. The message is again kiln_error(g).
 * - Shapes follow numpy: broadcasting for pointwise ops, negative dims count
 *   from the end, ranks 0 to KILN_MAX_RANK. Operation names and argument
 *   orders follow PyTorch (torch.* and torch.nn.functional.*).
 * - Every allocation goes through one hook (kiln_set_allocator), so an
 *   embedder can account for memory and a test can make the n-th one fail.
 */
#ifndef KILN_H
#define KILN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_MAX_RANK 8
#define KILN_NONE (-1)

typedef struct kiln_graph kiln_graph;
typedef int32_t kiln_value;

typedef enum {
    KILN_OK = 0,
    KILN_ERR_INPUT = 1,   /* a bad program, model, shape or data file */
    KILN_ERR_ENV = 2,     /* the environment failed: compiler, cache, I/O */
    KILN_ERR_NOMEM = 3,   /* an allocation failed */
} kiln_status;

typedef enum {
    KILN_F32 = 0,
    KILN_F64,
    KILN_I32,
    KILN_I64,
    KILN_BOOL,
    /* the narrower and unsigned integers, at the boundary only (ONNX
     * models' int8/uint8 ... inputs, outputs and files): a graph computes
     * them in f32, where every int8, uint8, int16 and uint16 is exact */
    KILN_I8,
    KILN_U8,
    KILN_I16,
    KILN_U16,
    KILN_U32,
    KILN_U64,
    /* half precision, at the boundary only (computed in f32, rounded to
     * nearest even when stored, as Inductor does on CPU) */
    KILN_F16,
    KILN_BF16,
} kiln_dtype;

/* A dense, C-ordered tensor. bool data is one byte per element (0 or 1). */
typedef struct {
    kiln_dtype dtype;
    int rank;
    int64_t shape[KILN_MAX_RANK];
    void *data;
} kiln_tensor;

/* ---- graphs ---------------------------------------------------------- */

kiln_graph *kiln_graph_new(void);          /* NULL only when out of memory */
void kiln_graph_free(kiln_graph *g);
const char *kiln_error(const kiln_graph *g); /* "" when no error happened */

/* A runtime input. Programs compute in f32, f64 and bool: dtype is one of
 * them. f64 values are computed in double by pointwise ops, reductions,
 * views and the composites built of them (softmax, layer_norm, pools),
 * matmul (OpenBLAS's dgemm; an f32 operand beside an f64 one is cast),
 * and gather (of f64 data; f64 indices are cast to f32, exact below
 * 2^24); conv2d, conv_transpose2d and the random ops take f32 only. An
 * op on f32 and f64 operands computes in f64; a scalar
 * (kiln_scalar) takes its partner's type.
 * A dim may be 0: such a value is empty, and no kernel computes one (the
 * results of ops on it are empty too, or follow from the op's kind: a
 * reduction over nothing is its identity; docs/design.md, "Empty values"). */
kiln_value kiln_input(kiln_graph *g, const char *name, kiln_dtype dtype,
                      int rank, const int64_t *shape);
/* A compile-time constant; data (numel floats) is copied. */
kiln_value kiln_weight(kiln_graph *g, const char *name, int rank,
                       const int64_t *shape, const float *data);
/* The same for dtype KILN_F32 (data: floats) or KILN_F64 (doubles). */
kiln_value kiln_weight_typed(kiln_graph *g, const char *name, kiln_dtype dtype, int rank,
                             const int64_t *shape, const void *data);
/* x converted to dtype: f32 <-> f64 (rounded to nearest), bool -> 0/1,
 * and to bool as x != 0. The identity when x already has it. */
kiln_value kiln_cast(kiln_graph *g, kiln_value x, kiln_dtype dtype);
/* A scalar (rank 0), broadcast where it is used: f32, or f64 beside an f64
 * operand. */
kiln_value kiln_scalar(kiln_graph *g, double v);

/* Pointwise ops by name.
 * unary:  neg abs relu sigmoid tanh exp log sqrt rsqrt sin cos erf floor
 *         ceil reciprocal gelu silu logical_not contiguous
 * binary: add sub mul div true_divide pow fmod maximum minimum lt le gt ge
 *         eq ne (div by a value the inner loop does not change is a
 *         reciprocal multiply, 1.5 ulp; true_divide is always rounded once) */
kiln_value kiln_unary(kiln_graph *g, const char *op, kiln_value x);
kiln_value kiln_binary(kiln_graph *g, const char *op, kiln_value a, kiln_value b);
kiln_value kiln_where(kiln_graph *g, kiln_value cond, kiln_value a, kiln_value b);
/* clamp(x, min=, max=); has_min/has_max say which bounds are given. */
kiln_value kiln_clamp(kiln_graph *g, kiln_value x, int has_min, double min,
                      int has_max, double max);

/* Reductions: op is sum, mean, amax, amin or prod. dims == NULL (ndims 0)
 * reduces over every dim. Negative dims count from the end. */
kiln_value kiln_reduce(kiln_graph *g, const char *op, kiln_value x,
                       int ndims, const int *dims, int keepdim);

/* Composites (decomposed into primitives before lowering). */
kiln_value kiln_softmax(kiln_graph *g, kiln_value x, int dim);
kiln_value kiln_log_softmax(kiln_graph *g, kiln_value x, int dim);
/* weight and bias may be KILN_NONE. */
kiln_value kiln_layer_norm(kiln_graph *g, kiln_value x, int nshape,
                           const int64_t *normalized_shape, kiln_value weight,
                           kiln_value bias, double eps);
/* Inference form; channels at dim 1; weight and bias may be KILN_NONE. */
kiln_value kiln_batch_norm(kiln_graph *g, kiln_value x, kiln_value mean,
                           kiln_value var, kiln_value weight, kiln_value bias,
                           double eps);

/* Views: index arithmetic, never a copy (contiguous() materializes). */
kiln_value kiln_transpose(kiln_graph *g, kiln_value x, int d0, int d1);
kiln_value kiln_permute(kiln_graph *g, kiln_value x, int n, const int *dims);
/* One entry of shape may be -1. */
kiln_value kiln_reshape(kiln_graph *g, kiln_value x, int n, const int64_t *shape);
/* An entry of -1 keeps that dim. */
kiln_value kiln_expand(kiln_graph *g, kiln_value x, int n, const int64_t *shape);
/* Python's slice(start, end, step).indices(size): negative start/end count
 * from the end and are clamped; step != 0, a negative step walks backwards
 * (an end of -size-1 or below runs to the first element, like Python's
 * None); the result must not be empty. */
kiln_value kiln_slice(kiln_graph *g, kiln_value x, int dim, int64_t start,
                      int64_t end, int64_t step);

/* Externs (library kernels). matmul follows torch.matmul (1-D, 2-D, batched
 * with batch broadcasting). conv2d is NCHW; bias may be KILN_NONE. */
kiln_value kiln_matmul(kiln_graph *g, kiln_value a, kiln_value b);
typedef struct {
    int stride[2], padding[2], dilation[2], groups;
} kiln_conv_params;
kiln_conv_params kiln_conv_defaults(void); /* stride 1, padding 0, dilation 1, groups 1 */
kiln_value kiln_conv2d(kiln_graph *g, kiln_value x, kiln_value w, kiln_value bias,
                       const kiln_conv_params *p);

/* Random: uniform [0, 1) of x's shape (x is not read), and dropout
 * (zero with probability p, else scale by 1/(1-p)). Values depend only on
 * the seed and the element index. */
kiln_value kiln_rand_like(kiln_graph *g, kiln_value x, uint64_t seed);
kiln_value kiln_dropout(kiln_graph *g, kiln_value x, double p, uint64_t seed);

/* Padding. mode KILN_PAD_CONSTANT fills with value; KILN_PAD_EDGE repeats
 * the border element; KILN_PAD_REFLECT mirrors without repeating the border
 * (numpy's "reflect"). before[d] and after[d] (n == rank of x) may be
 * negative: that crops. */
typedef enum { KILN_PAD_CONSTANT = 0, KILN_PAD_EDGE, KILN_PAD_REFLECT } kiln_pad_mode;
kiln_value kiln_pad(kiln_graph *g, kiln_value x, kiln_pad_mode mode, int n,
                    const int64_t *before, const int64_t *after, double value);
/* Concatenation of n values along dim (all other dims equal). */
kiln_value kiln_concat(kiln_graph *g, int n, const kiln_value *xs, int dim);

/* Pooling over the last nspatial (1 to 3) dims of x (N, C, spatial...).
 * Windows that start in the padding are allowed; ceil_mode rounds the
 * output size up (ONNX/PyTorch rules). count_include_pad: average pooling
 * divides by the full window (1) or by the elements inside the input (0). */
typedef struct {
    int nspatial;
    int64_t kernel[3], stride[3], dilation[3], pad_begin[3], pad_end[3];
    int ceil_mode, count_include_pad;
} kiln_pool_params;
kiln_value kiln_max_pool(kiln_graph *g, kiln_value x, const kiln_pool_params *p);
kiln_value kiln_avg_pool(kiln_graph *g, kiln_value x, const kiln_pool_params *p);

/* numpy.take(data, indices, axis): indices hold integral f32 values,
 * negative ones count from the end; an index out of range is a run-time
 * error. The result has data's dims with axis replaced by indices' dims. */
kiln_value kiln_gather(kiln_graph *g, kiln_value data, kiln_value indices, int axis);

/* Transposed convolution (the gradient of conv2d), NCHW, weight (C_in,
 * C_out/groups, kH, kW); bias may be KILN_NONE. Output size per spatial dim:
 * stride*(in-1) + output_padding + dilation*(k-1) + 1 - 2*padding. */
typedef struct {
    int stride[2], padding[2], output_padding[2], dilation[2], groups;
} kiln_conv_transpose_params;
kiln_value kiln_conv_transpose2d(kiln_graph *g, kiln_value x, kiln_value w,
                                 kiln_value bias, const kiln_conv_transpose_params *p);

/* Mark a value as a program output under a name (unique). */
kiln_status kiln_output(kiln_graph *g, kiln_value v, const char *name);

/* ---- inspecting a graph ---------------------------------------------- */

int kiln_value_rank(const kiln_graph *g, kiln_value v);
const int64_t *kiln_value_shape(const kiln_graph *g, kiln_value v);
kiln_dtype kiln_value_dtype(const kiln_graph *g, kiln_value v);
int kiln_num_inputs(const kiln_graph *g);
int kiln_num_outputs(const kiln_graph *g);
/* Name and declared type of input i (declaration order); data is NULL. */
const char *kiln_input_name(const kiln_graph *g, int i);
kiln_tensor kiln_input_desc(const kiln_graph *g, int i);
const char *kiln_output_name(const kiln_graph *g, int i);
kiln_tensor kiln_output_desc(const kiln_graph *g, int i);
/* Print the graph in a readable text form. */
void kiln_graph_dump(const kiln_graph *g, void *FILE_stream);

/* ---- the text format ------------------------------------------------- */

/* Parse a .kiln program into an empty graph. filename is used in messages
 * ("prog.kiln:3:9: error: ...") and to resolve file("w.npy") weights. */
kiln_status kiln_parse(kiln_graph *g, const char *src, const char *filename);
kiln_status kiln_parse_file(kiln_graph *g, const char *path);

/* ---- running ----------------------------------------------------------- */

/* Run the reference interpreter: every op by itself, every intermediate
 * materialized. inputs are in declaration order and must match the declared
 * dtype and shape; outputs (kiln_num_outputs entries) receive new tensors
 * to free with kiln_tensor_free. */
kiln_status kiln_interpret(kiln_graph *g, const kiln_tensor *inputs,
                           kiln_tensor *outputs);

/* ---- compiling: fused kernels ------------------------------------------ */

/* A compiled program: the fused kernels of a graph, generated as C,
 * compiled with the system compiler (cached) and loaded. It does not refer
 * to the graph after compiling.
 *
 * Threads. A compiled program is immutable: any number of threads may call
 * kiln_program_run and kiln_program_run_into on one program at once (not
 * kiln_program_free while they do). Each run takes the memory it writes
 * (the arena of intermediate values) from a pool the program owns, which
 * grows to the number of runs made at once and is then reused, so a
 * serving loop allocates nothing after warm-up beyond the outputs
 * kiln_program_run returns (kiln_program_run_into allocates none). A run's
 * error reaches only its caller: kiln_program_error, called on the thread
 * that made the run. The kernels and BLAS calls of a run use an OpenMP team
 * of up to kiln_options.threads threads led by the calling thread, set for
 * that run only, so programs with different counts do not change each
 * other's. Concurrent runs each have their own team: two 2-thread runs at
 * once on a 2-core machine would put 4 threads on 2 cores. A run may use
 * fewer threads than the program's count: the program times its runs and
 * uses the team size that has measured fastest (among threads, threads - 1,
 * half and 1), measuring the others again now and then at a cost of at
 * most 1% of run time. So when another process keeps a core busy, or
 * concurrent runs oversubscribe the cores, runs go on at about the speed
 * of fewer threads instead of waiting at every parallel loop for a thread
 * that shares a core (KILN_LOGS=team logs each choice; fixed_threads turns
 * it off). A whole-tensor sum's last bits follow the team size. To serve,
 * keep callers x threads <= cores (for example threads = 1 and one caller
 * per core). */
typedef struct kiln_program kiln_program;

typedef struct {
    int threads;   /* each run's team; <= 0: $KILN_NUM_THREADS, else every
                    * core (a bad $KILN_NUM_THREADS or more threads than
                    * cores warns once on stderr) */
    int fuse;      /* 1: fuse (default); 0: one kernel per op, every value in
                    * memory -- the eager baseline kiln bench compares with */
    int extern_epilogue;  /* 1 (default): pointwise consumers of a matmul or
                    * conv2d (bias, BN, relu, a residual add) run on each
                    * output block inside the library call; 0: they are
                    * kernels of their own, as in PyTorch Inductor */
    const char *target;   /* the instruction-set tier kernels are compiled
                    * for: "v2" (x86-64-v2, SSE4.2), "v3" (AVX2 + FMA), "v4"
                    * (AVX-512) or "native" (-march=native); NULL: $KILN_TARGET,
                    * else the highest tier this CPU runs. A tier the CPU
                    * cannot run is KILN_ERR_ENV (the message names the
                    * missing features), an unknown name KILN_ERR_INPUT. */
    int fixed_threads;    /* 0 (default): a run may use fewer than `threads`
                    * threads when fewer have measured faster (a core kept
                    * busy by another process, concurrent runs; see
                    * Threads); 1: every run uses exactly `threads` */
} kiln_options;
kiln_options kiln_default_options(void);

/* Compile g. On failure the message is kiln_error(g), and the graph stays
 * usable (the interpreter can still run it). kiln_compile(g, threads, out)
 * is kiln_compile_with default options and that thread count.
 *
 * Profiling: with KILN_PROFILE=1 in the environment every run of the
 * program is profiled, and kiln_program_free prints on stderr where the
 * time went: each kernel and library call (time per run, share, bytes
 * moved, GB/s, GFLOP/s for matmul and conv, threads busy, what ran it and
 * in which layout) and a summary by kind. KILN_TRACE=FILE.json profiles
 * too and writes a Chrome trace there (one track per OpenMP thread; open
 * it in Perfetto or chrome://tracing). Profiled runs of a program take
 * turns; the profiler adds two clock reads per call and per thread of a
 * parallel kernel (kiln bench --profile measures it). Another value of
 * KILN_PROFILE is KILN_ERR_INPUT; a KILN_TRACE file that cannot be made
 * (its folder missing or not writable, or the name a folder's) is
 * KILN_ERR_ENV, before anything compiles. A oneDNN call's line ends with
 * the implementation oneDNN ran ([oneDNN ran jit:avx2]). */
kiln_status kiln_compile(kiln_graph *g, int threads, kiln_program **out);
kiln_status kiln_compile_with(kiln_graph *g, const kiln_options *opt, kiln_program **out);
/* Same contract as kiln_interpret: inputs in declaration order, checked;
 * outputs receive new tensors (kiln_tensor_free). */
kiln_status kiln_program_run(kiln_program *p, const kiln_tensor *inputs, kiln_tensor *outputs);
/* The same into memory the caller owns: outputs[i] must have output i's
 * dtype and shape and data for it (kiln_output_desc + kiln_tensor_alloc;
 * an empty output, with a dim of 0, needs none, as an empty input).
 * Reusing outputs across runs saves the page faults of fresh memory, which
 * on a large output cost more than the kernels themselves. */
kiln_status kiln_program_run_into(kiln_program *p, const kiln_tensor *inputs,
                                  kiln_tensor *outputs);
/* The message of the calling thread's last failed run of p ("" if none). */
const char *kiln_program_error(const kiln_program *p);
/* The threads each run of p uses (kiln_options.threads, resolved). */
int kiln_program_threads(const kiln_program *p);
/* One model, many shapes. A program compiled from an ONNX model whose
 * symbolic dims took the shapes given at import (and whose inputs were not
 * specialized to values) runs on inputs of other shapes too: the first
 * run at a new set of input shapes imports the model again with them
 * (its fixed dims are checked as at import: "inputs of a new shape: ...
 * dim 1 is fixed at 4" otherwise), compiles it and keeps it, so later runs
 * at that shape, from any thread, compile nothing (the JIT cache also keeps
 * it across processes). At most 65 shapes per program. Any other program
 * has one shape, and other shapes are refused as before.
 * kiln_program_shapes says how many shapes p holds; kiln_program_outputs_for
 * fills descs[i] (dtype, rank, shape; data NULL) with output i's for
 * inputs' shapes, compiling that shape if it is new, for the memory
 * kiln_program_run_into needs. */
int kiln_program_shapes(const kiln_program *p);
kiln_status kiln_program_outputs_for(kiln_program *p, const kiln_tensor *inputs,
                                     kiln_tensor *descs);
const char *kiln_program_source(const kiln_program *p);  /* the generated C */
void kiln_program_free(kiln_program *p);

/* ---- tensors and .npy files ------------------------------------------ */

int64_t kiln_tensor_numel(const kiln_tensor *t);
size_t kiln_dtype_size(kiln_dtype dt);
const char *kiln_dtype_name(kiln_dtype dt);    /* "f32", "bool", ... */
/* Allocate data for a tensor whose dtype, rank and shape are set. */
kiln_status kiln_tensor_alloc(kiln_tensor *t);
void kiln_tensor_free(kiln_tensor *t);
/* Fill with standard normal (f32) or uniform [0,1) values from a seed;
 * the same seed gives the same values on every machine and thread count. */
void kiln_fill_randn(float *data, int64_t n, uint64_t seed);
void kiln_fill_rand(float *data, int64_t n, uint64_t seed);

/* numpy .npy files, format versions 1 to 3; f32 f64 bool and the integers
 * (i8 u8 i16 u16 i32 u32 i64 u64), C order.
 * err receives a message naming the file on failure. Writing goes to a
 * temporary name first and is renamed into place, so a failure leaves no
 * partial file. */
kiln_status kiln_npy_read(const char *path, kiln_tensor *out, char *err, size_t errlen);
kiln_status kiln_npy_write(const char *path, const kiln_tensor *t, char *err, size_t errlen);

/* ---- memory ------------------------------------------------------------ */

/* All of kiln's allocations go through one function, Lua-style:
 * alloc(ud, ptr, oldsize, newsize): newsize 0 frees ptr and returns NULL;
 * otherwise it returns a block of newsize bytes holding the old contents
 * (ptr NULL: a new block), aligned to 16 bytes as malloc's are, or NULL on
 * failure. NULL restores the default. (Tensor data is placed on a 64-byte
 * cache line inside such a block.)
 * The hook is process-wide; set it before building any graph. kiln may
 * call it from several threads at once (library kernels allocate scratch
 * per thread), so it must be thread-safe, as malloc is.
 * The default allocator refuses to hold more than the machine can back
 * (physical memory plus swap, or the cgroup's limit), or $KILN_MEM_LIMIT
 * bytes (K, M, G, T suffixes) when set, so a tensor too large for memory is
 * KILN_ERR_NOMEM rather than a process the OOM killer ends later. */
typedef void *(*kiln_alloc_fn)(void *ud, void *ptr, size_t oldsize, size_t newsize);
void kiln_set_allocator(kiln_alloc_fn fn, void *ud);

/* ---- ONNX ---------------------------------------------------------------- */

/* Import an ONNX model (.onnx, default-domain opsets 1 to 21) into an empty
 * graph. Inputs and outputs keep their ONNX names and order (initializers
 * are not inputs: they become weights, so Conv-BN folding applies), and
 * computations on constants alone (Shape -> Gather -> Concat -> Reshape)
 * fold at import. Inputs with symbolic or unknown dims need a shape from
 * shapes[] (by input name); a shape given must keep the rank and every dim
 * the model fixes (KILN_ERR_INPUT naming both shapes otherwise), as ONNX
 * Runtime requires. An entry with a value specializes the model
 * to it: an int32/int64 input becomes a constant, as a Reshape's shape or
 * Pad's pads given as inputs must be (kiln's shapes are static), and the
 * graph keeps the input, unread; another input stays a run-time input
 * whose value is read where the import needs a constant (Range's bounds, a
 * Loop's trip count, NonZero's and Compress's sizes), so the program must
 * be run with that same value (nothing checks it at run time). Graphs
 * compute in f32, f64 (DOUBLE tensors) and bool: integer inputs and
 * outputs are f64 in the graph (int32, int64, uint32, uint64: exact to
 * 2^53; past that an input is refused) or f32 (the 8- and 16-bit types),
 * and io, when
 * not NULL, receives each one's ONNX type for kiln_tensor_convert at the
 * boundary. Control flow: an If whose condition folds takes its branch; a
 * Loop or Scan with a known, small trip count is unrolled, an If with
 * cheap branches is a where; any other becomes a call of compiled
 * sub-programs that the runtime runs (a trip count or condition computed
 * at run time; a run-time error inside one names its Loop, Scan or If);
 * the environment's KILN_CONTROL_FLOW ("auto", "unroll" or "call") can
 * force one way. Messages name the file and the node (index, name, op); an op
 * kiln lacks is "unsupported op NAME (opset N) at node M ('name')", and
 * several such nodes are all listed in one message. */
typedef struct {
    const char *name;            /* a graph input's ONNX name */
    int rank;
    int64_t shape[KILN_MAX_RANK];
    const kiln_tensor *value;    /* NULL, or the input's value (same shape) */
} kiln_onnx_input;
typedef struct {
    int ninputs, noutputs;
    const kiln_dtype *input_type;   /* ONNX type of each input (F32, BOOL or an integer); */
    const kiln_dtype *output_type;  /* owned by the graph */
} kiln_onnx_io;
kiln_status kiln_onnx_import(kiln_graph *g, const char *path, int nshapes,
                             const kiln_onnx_input *shapes, kiln_onnx_io *io);
/* The same from memory; filename is used in messages, and its folder is
 * where external data (TensorProto external_data, for weights past 2 GB)
 * is read from: a location must be relative, without "..", and lead to a
 * regular file inside that folder (links resolved); offset and length are
 * checked against the file, which is memory-mapped while its values are
 * read. */
kiln_status kiln_onnx_import_buffer(kiln_graph *g, const void *data, size_t len,
                                    const char *filename, int nshapes,
                                    const kiln_onnx_input *shapes, kiln_onnx_io *io);

/* ONNX TensorProto files (.pb, as in ONNX's test data): f32 f64 bool and
 * the integers (i8 u8 i16 u16 i32 u32 i64 u64; 64-bit ones read exactly);
 * other element types are an
 * error naming the type. A dim may be 0
 * (data then holds nothing): only an ONNX model's specialized int input
 * can be empty (ReduceSum's axes). */
kiln_status kiln_pb_read(const char *path, kiln_tensor *out, char *err, size_t errlen);
kiln_status kiln_pb_write(const char *path, const kiln_tensor *t, const char *name,
                          char *err, size_t errlen);
/* A copy of src as dtype to (any kiln_dtype). Integers from or to f32 must
 * be exact (|v| <= 2^24, integral), integers to f64 too (|v| <= 2^53), and
 * a value converted to an integer type must lie in its range: otherwise
 * KILN_ERR_INPUT. */
kiln_status kiln_tensor_convert(const kiln_tensor *src, kiln_dtype to, kiln_tensor *dst,
                                char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
