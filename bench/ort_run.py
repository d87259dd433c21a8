"""bench/ort_run.py -- run an ONNX model with ONNX Runtime's Python API and time it.

  VENV_PYTHON bench/ort_run.py MODEL.onnx THREADS REPEAT OUTDIR|- [--profile PREFIX]
      NAME=FILE.npy ...

Runs under the venv models/real.py makes (build/real/venv: onnxruntime and
numpy from PyPI; bench/compare, bench/models.py and models/selftest.sh
make it when it is missing). The environment may set
  ORT_ALLOW_SPINNING=0   intra-op threads sleep between tasks instead of
                         spinning (what OMP_WAIT_POLICY=passive does for libgomp)
  ORT_PLAIN_REPEAT=N     how many plain runs (default REPEAT)
  ORT_PREALLOC=0         leave out the preallocated runs

Loads the model (graph optimizations at ORT_ENABLE_ALL, intra_op_num_threads
= THREADS, inter_op_num_threads = 1, sequential, CPU execution provider),
feeds the .npy inputs (cast to the model's input type where the file's
differs, as for float16 inputs), runs once to warm up, then times two ways:
  prealloc: inputs and outputs bound once with an IOBinding, outputs
            preallocated as numpy arrays, so ORT writes into the same memory
            every run (no allocation, no copy); checked to give the plain
            run's answer bit for bit;
  plain:    session.run(None, feeds), ORT returning fresh output arrays.
Writes every output to OUTDIR/NAME.npy (unless OUTDIR is -) and prints one
JSON line: load_ms, prealloc_ms, prealloc_median_ms, prealloc_error,
plain_ms, plain_median_ms, outputs, rss_kib (this process's VmHWM at its
end), profile (the trace file, with --profile: enable_profiling with that
prefix).
"""

import json
import os
import sys
import time

import numpy as np
import onnxruntime as ort

TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16,
         "tensor(double)": np.float64, "tensor(int64)": np.int64, "tensor(int32)": np.int32,
         "tensor(int8)": np.int8, "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}


def median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def timed(fn, n):
    ts = []
    for _ in range(n):
        a = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - a) * 1e3)
    return ts


def main(argv):
    if len(argv) < 4:
        sys.exit("usage: ort_run.py MODEL THREADS REPEAT OUTDIR|- [--profile PREFIX] NAME=FILE.npy ...")
    model, threads, repeat, outdir = argv[0], int(argv[1]), int(argv[2]), argv[3]
    rest, prof = argv[4:], None
    if rest[:1] == ["--profile"]:
        prof, rest = rest[1], rest[2:]
    feeds = {}
    for b in rest:
        k, f = b.split("=", 1)
        feeds[k] = np.load(f)
    o = ort.SessionOptions()
    o.intra_op_num_threads = threads
    o.inter_op_num_threads = 1
    o.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    spin = os.environ.get("ORT_ALLOW_SPINNING")
    if spin is not None:
        o.add_session_config_entry("session.intra_op.allow_spinning", spin)
    if prof:
        o.enable_profiling = True
        o.profile_file_prefix = prof
    t0 = time.perf_counter()
    s = ort.InferenceSession(model, o, providers=["CPUExecutionProvider"])
    load_ms = (time.perf_counter() - t0) * 1e3
    for i in s.get_inputs():
        want = TYPES.get(i.type)
        if i.name in feeds and want is not None and feeds[i.name].dtype != want:
            feeds[i.name] = feeds[i.name].astype(want)
    names = [x.name for x in s.get_outputs()]
    first = s.run(None, feeds)
    if outdir != "-":
        for name, y in zip(names, first):
            np.save(os.path.join(outdir, name + ".npy"), y)
    prealloc, prealloc_error = None, None
    if os.environ.get("ORT_PREALLOC", "1") != "0":
        try:
            io = s.io_binding()
            for k, v in feeds.items():
                io.bind_cpu_input(k, np.ascontiguousarray(v))
            outs = [np.empty_like(y) for y in first]
            for name, y in zip(names, outs):
                io.bind_output(name, "cpu", 0, y.dtype, list(y.shape), y.ctypes.data)
            s.run_with_iobinding(io)  # warm-up, and does it work at all
            prealloc = timed(lambda: s.run_with_iobinding(io), repeat)
            for name, a, b in zip(names, outs, first):
                if not np.array_equal(a, b, equal_nan=a.dtype.kind == "f"):
                    raise RuntimeError("preallocated output %s differs from the plain run's" % name)
        except Exception as e:  # noqa: BLE001 -- reported, and the plain runs still count
            prealloc, prealloc_error = None, str(e).strip().splitlines()[0][:200]
    plain = timed(lambda: s.run(None, feeds), int(os.environ.get("ORT_PLAIN_REPEAT", repeat)))
    out = {"ort_version": ort.__version__, "threads": threads, "repeat": repeat,
           "load_ms": load_ms, "allow_spinning": spin if spin is not None else "default",
           "prealloc_ms": prealloc, "prealloc_median_ms": median(prealloc) if prealloc else None,
           "prealloc_error": prealloc_error, "plain_ms": plain, "plain_median_ms": median(plain),
           "outputs": names}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                out["rss_kib"] = int(line.split()[1])
    if prof:
        out["profile"] = s.end_profiling()
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
