#!/usr/bin/python3
"""bench/conv_torch.py -- PyTorch's conv2d (Debian's python3-torch, eager,
no_grad, NCHW float32) on the shapes of bench/conv_bench.c, for comparison
with `make bench-conv`; not a test.

  bench/conv_torch.py [--threads 1,2] [--batch 1,8] [--min-ms 200] [--only NAME]

Prints the same columns as conv_bench: the best time of runs after one
warm-up (at least 3 runs and --min-ms ms), and GFLOP/s (2 * N * O * OH * OW
* C/groups * KH * KW flops, bias not counted). torch allocates a fresh
output on every call, as users call it.
"""
import argparse
import time

import torch
import torch.nn.functional as F

SHAPES = [  # name, c, hw, o, k, stride, pad, groups: as in conv_bench.c
    ("stem 7x7/2 3->64 @224", 3, 224, 64, 7, 2, 3, 1),
    ("layer1 3x3 64 @56", 64, 56, 64, 3, 1, 1, 1),
    ("layer2 3x3/2 64->128 @56", 64, 56, 128, 3, 2, 1, 1),
    ("layer2 3x3 128 @28", 128, 28, 128, 3, 1, 1, 1),
    ("layer3 3x3 256 @14", 256, 14, 256, 3, 1, 1, 1),
    ("layer4 3x3 512 @7", 512, 7, 512, 3, 1, 1, 1),
    ("down 1x1/2 64->128 @56", 64, 56, 128, 1, 2, 0, 1),
    ("1x1 256->256 @14", 256, 14, 256, 1, 1, 0, 1),
    ("dw 3x3 64 @56", 64, 56, 64, 3, 1, 1, 64),
    ("dw 3x3 256 @14", 256, 14, 256, 3, 1, 1, 256),
]


def best_ms(fn, min_ms):
    fn()
    best, start, n = float("inf"), time.perf_counter(), 0
    while n < 3 or (time.perf_counter() - start) * 1e3 < min_ms:
        t0 = time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - t0) * 1e3)
        n += 1
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--min-ms", type=float, default=200)
    ap.add_argument("--only")
    a = ap.parse_args()
    print("| shape | N | threads | GFLOP | torch ms | torch GFLOP/s |")
    for name, c, hw, o, k, st, pad, g in SHAPES:
        if a.only and a.only not in name:
            continue
        for n in (int(b) for b in a.batch.split(",")):
            x = torch.randn(n, c, hw, hw)
            w = torch.randn(o, c // g, k, k)
            b = torch.randn(o)
            oh = (hw + 2 * pad - k) // st + 1
            gflop = 2.0 * n * o * oh * oh * (c // g) * k * k / 1e9
            for t in (int(t) for t in a.threads.split(",")):
                torch.set_num_threads(t)
                with torch.no_grad():
                    ms = best_ms(lambda: F.conv2d(x, w, b, st, pad, 1, g), a.min_ms)
                print("| %-26s | %d | %d | %7.3f | %8.2f | %6.1f |" % (name, n, t, gflop, ms, gflop / ms * 1e3),
                      flush=True)


if __name__ == "__main__":
    main()
