#!/usr/bin/python3
"""bench/torch_eager.py NAME SIZE THREADS REPEAT -- PyTorch eager time of a
bench/workloads.py workload (torch.no_grad(), torch.set_num_threads), the
best and the median of REPEAT runs after 3 warm-ups, as one JSON line:
{"min_ms": ..., "median_ms": ..., "capability": ...}. bench/run --targets
runs it with ATEN_CPU_CAPABILITY set to match each target tier (default for
v2, avx2 for v3, avx512 for v4): ATen's own kernels then use the same
vector width. Not a test."""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import workloads as W  # noqa: E402


def main():
    name, size, threads, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    w = W.by_name(name)
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    t = {n: torch.randn(*s, generator=g) for n, s in w.inputs(size).items()}
    t.update({n: torch.randn(*s, generator=g) for n, s in w.weights(size).items()})
    with torch.no_grad():
        for _ in range(3):
            w.torch(torch, t, size)
        ts = []
        for _ in range(repeat):
            a = time.perf_counter()
            w.torch(torch, t, size)
            ts.append((time.perf_counter() - a) * 1e3)
    ts.sort()
    cap = torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else \
        os.environ.get("ATEN_CPU_CAPABILITY", "?")
    print(json.dumps({"min_ms": ts[0], "median_ms": ts[len(ts) // 2], "capability": cap,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
