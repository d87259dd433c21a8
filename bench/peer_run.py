"""bench/peer_run.py -- a bench/workloads.py workload, or a model, through
OpenVINO, JAX/XLA or TVM, timed.

  VENV_PYTHON bench/peer_run.py PEER SOURCE THREADS REPEAT OUTDIR|- CACHE NAME=FILE.npy ...

PEER and SOURCE:
  openvino MODEL.onnx   OpenVINO's CPU plugin (PERFORMANCE_HINT LATENCY,
                        INFERENCE_NUM_THREADS = THREADS, INFERENCE_PRECISION_HINT
                        f32: no bf16 or f16 compute, as every other runner), its model cache in
                        CACHE (CACHE_DIR); one infer request, reused (its
                        output tensors are its own, written in place every run)
  tvm MODEL.onnx        TVM Relax: the ONNX frontend, relax.build for
                        {"kind": "llvm", "mcpu": <GCC's -march=native>} with
                        the default CPU pipeline (LegalizeOps, FuseOps,
                        FuseTIR: no MetaSchedule tuning, no dlight rules),
                        run by the Relax VM with TVM_NUM_THREADS = THREADS;
                        CACHE/model.so is the exported library (loaded
                        instead of built when it exists, as a deployment
                        does); the VM allocates the outputs every run
  jax WORKLOAD:SIZE     jax.jit of the workload's jax() definition on the CPU
                        (XLA), the inputs and weights as arguments, placed
                        on the device once; persistent compilation cache in
                        CACHE; one thread: XLA's flags
                        --xla_cpu_multi_thread_eigen=false
                        intra_op_parallelism_threads=1 and this process
                        pinned to one core; XLA allocates the outputs every
                        run, and each run waits for them (block_until_ready)

Runs under build/peers/venv (bench/compare installs openvino, jax,
apache-tvm and onnx there from PyPI). The NAME=FILE.npy pairs give the
inputs (and, for jax, the weights). Times the compile (load and compile in
this process: cold when CACHE is empty, cached when an earlier process
filled it) and the first call, warms up twice more, then times REPEAT calls
(fewer when a call is slow: as many as fit in about 2 s, at least 1).
Writes every output to OUTDIR/NAME.npy (unless OUTDIR is -) and prints one
JSON line: peer, version, compile_ms, first_call_ms, median_ms, cached,
outputs.
"""

import json
import os
import sys
import time


def median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def march():
    """GCC's -march=native (the CPU name LLVM knows too: znver3, skylake-avx512)."""
    import subprocess
    try:
        out = subprocess.run(["gcc", "-march=native", "-Q", "--help=target"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True).stdout
    except OSError:
        return None
    for line in out.splitlines():
        f = line.split()
        if len(f) == 2 and f[0] == "-march=":
            return f[1]
    return None


def openvino_peer(src, threads, cache, feeds):
    import openvino as ov
    core = ov.Core()
    core.set_property({"CACHE_DIR": cache})
    cached = bool(os.listdir(cache))
    a = time.perf_counter()
    cm = core.compile_model(src, "CPU", {"PERFORMANCE_HINT": "LATENCY",
                                         "INFERENCE_NUM_THREADS": threads,
                                         "INFERENCE_PRECISION_HINT": "f32"})
    compile_ms = (time.perf_counter() - a) * 1e3
    req = cm.create_infer_request()
    inputs = {p.get_any_name(): feeds[p.get_any_name()] for p in cm.inputs}
    names = [p.get_any_name() for p in cm.outputs]

    def run():
        req.infer(inputs)
        return [req.get_output_tensor(i).data for i in range(len(names))]
    return ov.__version__.split("-")[0], compile_ms, cached, run, names


def tvm_peer(src, threads, cache, feeds):
    os.environ["TVM_NUM_THREADS"] = str(threads)
    import numpy as np
    import onnx
    import tvm
    from tvm import relax
    lib = os.path.join(cache, "model.so")
    cached = os.path.exists(lib)
    model = onnx.load(src)
    in_names = [i.name for i in model.graph.input
                if i.name not in {t.name for t in model.graph.initializer}]
    names = [o.name for o in model.graph.output]
    a = time.perf_counter()
    if cached:
        ex = tvm.runtime.load_module(lib)
    else:
        from tvm.relax.frontend.onnx import from_onnx
        mod = from_onnx(model, keep_params_in_input=False)
        target = {"kind": "llvm"}
        cpu = march()
        if cpu:
            target["mcpu"] = cpu
        ex = relax.build(mod, target=tvm.target.Target(target))
        tmp = lib + ".tmp.%d" % os.getpid()
        ex.export_library(tmp)
        os.replace(tmp, lib)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    compile_ms = (time.perf_counter() - a) * 1e3
    tensor = getattr(tvm.runtime, "tensor", None) or tvm.nd.array
    args = [tensor(np.ascontiguousarray(feeds[n])) for n in in_names]
    f = vm["main"]

    def run():
        out = f(*args)
        outs = [out] if hasattr(out, "numpy") else list(out)
        return [o.numpy() for o in outs]
    return tvm.__version__, compile_ms, cached, run, names


def jax_peer(src, threads, cache, feeds):
    if threads == 1:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import jax
    import jax.numpy as jnp
    import workloads as W
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    cached = bool(os.listdir(cache))
    wname, size = src.split(":")
    w = W.by_name(wname)
    names = list(w.inputs(size)) + list(w.weights(size))
    missing = [n for n in names if n not in feeds]
    if missing:
        sys.exit("peer_run.py: no file for %s" % ", ".join(missing))

    def fn(*args):
        return tuple(w.jax(jnp, jax, dict(zip(names, args)), size))
    args = [jax.device_put(feeds[n]) for n in names]
    a = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_ms = (time.perf_counter() - a) * 1e3

    def run():
        out = compiled(*args)
        jax.block_until_ready(out)
        return out
    return jax.__version__, compile_ms, cached, run, list(w.outputs)


PEERS = {"openvino": openvino_peer, "tvm": tvm_peer, "jax": jax_peer}


def main(argv):
    if len(argv) < 6 or argv[0] not in PEERS:
        sys.exit("usage: peer_run.py openvino|tvm|jax SOURCE THREADS REPEAT OUTDIR|- CACHE NAME=FILE.npy ...")
    peer, src, threads, repeat, outdir, cache = argv[0], argv[1], int(argv[2]), int(argv[3]), argv[4], argv[5]
    import numpy as np
    feeds = {}
    for kv in argv[6:]:
        n, p = kv.split("=", 1)
        feeds[n] = np.load(p)
    os.makedirs(cache, exist_ok=True)
    version, compile_ms, cached, run, names = PEERS[peer](src, threads, cache, feeds)
    a = time.perf_counter()
    out = run()
    first = (time.perf_counter() - a) * 1e3
    for _ in range(2 if first < 1000 else 0):
        run()
    if first > 200:   # untuned TVM takes seconds a call on a matmul or a conv
        repeat = max(1, min(repeat, int(2000 / first)))
    ts = []
    for _ in range(repeat):
        a = time.perf_counter()
        out = run()
        ts.append((time.perf_counter() - a) * 1e3)
    if outdir != "-":
        for n, o in zip(names, out):
            np.save(os.path.join(outdir, n + ".npy"), np.asarray(o))
    print(json.dumps({"peer": peer, "version": version, "compile_ms": compile_ms, "first_call_ms": first,
                      "median_ms": median(ts), "cached": cached, "outputs": names}))


if __name__ == "__main__":
    main(sys.argv[1:])
