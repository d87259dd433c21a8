"""bench/inductor_run.py -- a bench/workloads.py workload through torch.compile
(PyTorch Inductor, CPU), timed.

  VENV_PYTHON bench/inductor_run.py [--mode MODE] WORKLOAD SIZE THREADS REPEAT OUTDIR|- NAME=FILE.npy ...
  VENV_PYTHON bench/inductor_run.py [--mode MODE] --model NAME STATE.pt THREADS REPEAT OUTDIR|- input=FILE.npy

The second form compiles a model of models/export.py (its architecture,
built here, with the weights bench/compare saved from the module it
exported, so both run the same model; its one output is "output").

Runs under the venv scripts/vs_inductor.py and bench/compare make
(build/peers/venv: torch 2.x and numpy from PyPI). The NAME=FILE.npy
pairs give the workload's inputs and weights (its weights are buffers of
the module, as bench/compare's ONNX export has them: inputs of the graph
Inductor compiles, since freezing is off in the default mode). Compiles
the workload's torch function with torch.compile (default mode, or
--mode max-autotune: Inductor benchmarks its GEMM and conv templates
against the library calls and picks the fastest) and
torch.no_grad(), times the first call (the compile: cold when
TORCHINDUCTOR_CACHE_DIR is empty, cached when an earlier process filled
it), warms up twice more, then times REPEAT calls (torch allocates the
outputs on every call, as eager torch does). Writes every output to
OUTDIR/NAME.npy (unless OUTDIR is -) and prints one JSON line: torch,
first_call_ms, median_ms, outputs.
"""

import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads as W  # noqa: E402


def median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def timed_calls(g, args, repeat):
    """The first call (the compile), two warm-ups, then REPEAT timed calls:
    (first call ms, median ms, the last outputs)."""
    a = time.perf_counter()
    out = g(*args)
    first = (time.perf_counter() - a) * 1e3
    for _ in range(2):
        g(*args)
    ts = []
    for _ in range(repeat):
        a = time.perf_counter()
        out = g(*args)
        ts.append((time.perf_counter() - a) * 1e3)
    return first, median(ts), out


def report(mode, outdir, names, outs, first, med):
    if outdir != "-":
        for n, o in zip(names, outs):
            np.save(os.path.join(outdir, n + ".npy"), o.numpy())
    print(json.dumps({"torch": torch.__version__, "mode": mode or "default", "first_call_ms": first,
                      "median_ms": med, "outputs": list(names)}))


def model_main(mode, argv):
    if len(argv) < 6:
        sys.exit("usage: inductor_run.py [--mode MODE] --model NAME STATE.pt THREADS REPEAT OUTDIR input=FILE.npy")
    name, state, threads, repeat, outdir = argv[0], argv[1], int(argv[2]), int(argv[3]), argv[4]
    torch.set_num_threads(threads)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models"))
    import export as E
    model, _ = E.make(name)
    model.load_state_dict(torch.load(state))
    model.eval()
    x = torch.from_numpy(np.load(argv[5].split("=", 1)[1]))
    with torch.no_grad():
        first, med, out = timed_calls(torch.compile(model, mode=mode), [x], repeat)
    report(mode, outdir, ["output"], [out], first, med)


def main(argv):
    mode = None
    if argv[:1] == ["--mode"]:
        mode, argv = argv[1], argv[2:]
    if argv[:1] == ["--model"]:
        return model_main(mode, argv[1:])
    if len(argv) < 5:
        sys.exit("usage: inductor_run.py WORKLOAD SIZE THREADS REPEAT OUTDIR|- NAME=FILE.npy ...")
    w = W.by_name(argv[0])
    size, threads, repeat, outdir = argv[1], int(argv[2]), int(argv[3]), argv[4]
    torch.set_num_threads(threads)
    t = {}
    for kv in argv[5:]:
        n, p = kv.split("=", 1)
        t[n] = torch.from_numpy(np.load(p))
    names, wnames = list(w.inputs(size)), list(w.weights(size))
    missing = [n for n in names + wnames if n not in t]
    if missing:
        sys.exit("inductor_run.py: no file for %s" % ", ".join(missing))

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for n in wnames:
                self.register_buffer(n, t[n].clone())

        def forward(self, *args):
            d = dict(zip(names, args))
            d.update({n: getattr(self, n) for n in wnames})
            return tuple(w.torch(torch, d, size))

    m = M().eval()
    args = [t[n] for n in names]
    with torch.no_grad():
        first, med, out = timed_calls(torch.compile(m, mode=mode), args, repeat)
    report(mode, outdir, w.outputs, out, first, med)


if __name__ == "__main__":
    main(sys.argv[1:])
