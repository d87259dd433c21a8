#!/usr/bin/env python3
"""scripts/vs_inductor.py -- kiln's fusion decisions beside PyTorch Inductor's,
program by program.

  python3 scripts/vs_inductor.py [--kiln build/kiln] [--work build/peers]
                                 [--only chain,wall,...] [--doc docs/vs-inductor.md]

For each seed experiment of examples/ (and attention), the same
computation runs through `kiln explain PROG --report FILE.json` and through
`torch.compile` (Inductor's CPU C++ backend, default mode, one thread) with
TORCH_LOGS="fusion,output_code" and Inductor's caches off, so that every
run compiles and logs. From each side it reads:

  nodes    scheduler nodes before fusion (the first "attempting fusion"
           round's count; kiln's report: fusion.nodes_before)
  rounds   fusion rounds until nothing fuses (Inductor's first
           scheduler pass: "completed fusion round" lines before
           "fusion complete")
  after    nodes left after the rounds ("fused A nodes into B nodes")
  kernels  generated C++ functions (Inductor's cpp_fused_* definitions,
           kiln's pointwise and reduction kernels)
  externs  library calls (Inductor: extern_kernels.* and torch.ops.* in the
           call function; kiln: extern kernels)
  nests    top-level loop nests summed over the generated functions (a
           `for` at a kernel's shallowest loop indentation in Inductor's
           C++; kiln's loop_nests)

and writes the table between the markers of docs/vs-inductor.md (with
--doc), naming the torch version and the CPU. It makes WORK/venv with
torch from PyPI when missing (pip; a large download the first time, then
reused) and re-executes itself there; numpy comes with it.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import common as C  # noqa: E402  (the venv, the machine, the load)

# name: (kiln program, torch function source, inputs {name: shape}, weights)
# The torch side is the same computation as the .kiln program, eager
# semantics, f32; weights are constants of the function (closure tensors).
EXPERIMENTS = {
    "chain": ("examples/chain.kiln", "lambda x: torch.sin(torch.relu(x + 1) * 2)",
              {"x": (1024, 1024)}),
    "rowsum": ("examples/rowsum.kiln", "lambda x: torch.relu(x + 1).sum(dim=1)",
               {"x": (1024, 1024)}),
    "siblings": ("examples/siblings.kiln", "lambda x: (x.amax(dim=1), x.sum(dim=1))",
                 {"x": (1024, 1024)}),
    "unrelated": ("examples/unrelated.kiln", "lambda x, y: (x.amax(dim=1), y.sum(dim=1))",
                  {"x": (1024, 1024), "y": (1024, 1024)}),
    "wall": ("examples/wall.kiln", "lambda x: torch.relu(x - x.mean())", {"x": (1024, 1024)}),
    "wall_chain": ("examples/wall_chain.kiln",
                   "lambda x: (lambda t: torch.relu(t - t.mean()) * 3)(torch.relu(x * 2 + 1))",
                   {"x": (1024, 1024)}),
    "softmax": ("examples/softmax.kiln", "lambda x: torch.softmax(x, dim=1)", {"x": (1024, 1024)}),
    "extern": ("examples/extern.kiln", "lambda x: torch.relu((x + 1) @ W['w'])",
               {"x": (256, 256)}, {"w": (256, 256)}),
    "layout": ("examples/layout.kiln", "lambda x: (x.sum(dim=1), x.sum(dim=0))",
               {"x": (1024, 1024)}),
    "long_chain": ("examples/long_chain.kiln", "long_chain", {"x": (4096,)}),
    "dropout": ("examples/dropout.kiln",
                "lambda x: (lambda d: d * 2 + d)(F.dropout(x, p=0.25, training=True))",
                {"x": (1024, 1024)}),
    "conv_bn_relu": ("examples/conv_bn_relu.kiln",
                     "lambda x: torch.relu(F.batch_norm(F.conv2d(x, W['w'], padding=1), "
                     "W['mean'], torch.ones(64), W['gamma'], W['beta'], False, 0.0, 1e-5))",
                     {"x": (1, 64, 56, 56)},
                     {"w": (64, 64, 3, 3), "mean": (64,), "gamma": (64,), "beta": (64,)}),
    "residual": ("examples/residual.kiln", "lambda x, r: torch.relu(x + r)",
                 {"x": (1024, 1024), "r": (1024, 1024)}),
    "gelu_bias": ("examples/gelu_bias.kiln", "lambda x, b: F.gelu(x + b)",
                  {"x": (1024, 1024), "b": (1024,)}),
    "layernorm": ("examples/layernorm.kiln",
                  "lambda x, g, b: F.layer_norm(x, [1024], g, b, 1e-5)",
                  {"x": (512, 1024), "g": (1024,), "b": (1024,)}),
    "attention": (None, "lambda q, k, v: torch.softmax((q @ k.transpose(1, 2)) * 0.125, dim=2) @ v",
                  {"q": (4, 128, 64), "k": (4, 128, 64), "v": (4, 128, 64)}),
}

ATTENTION_KILN = """input q: f32[4, 128, 64]
input k: f32[4, 128, 64]
input v: f32[4, 128, 64]
s = softmax((q @ permute(k, 0, 2, 1)) * 0.125, dim=2)
y = s @ v
output y
"""

# The child process: compile one function with Inductor and call it once.
CHILD = r"""
import sys, torch
import torch.nn.functional as F
torch.set_num_threads(1)
torch.manual_seed(0)
spec = eval(sys.argv[1])
src, inputs, weights = spec
W = {k: torch.randn(*s) for k, s in weights.items()}
if src == "long_chain":
    def fn(x):
        outs, t = [], x + 1
        outs.append(t)
        for i in range(1, 100):
            t = t * 1.0001 + 0.5 if i % 2 else torch.sin(t)
            outs.append(t)
        return tuple(outs)
else:
    fn = eval(src)
args = [torch.randn(*s) for s in inputs.values()]
with torch.no_grad():
    torch.compile(fn)(*args)
"""


def in_venv(work):
    py = C.torch_venv(work)
    if os.path.realpath(sys.prefix) != os.path.realpath(os.path.dirname(os.path.dirname(py))):
        os.execv(py, [py] + sys.argv)


def kiln_side(kiln, prog, tmp):
    rep = os.path.join(tmp, "report.json")
    subprocess.run([kiln, "explain", prog, "--report", rep], check=True, stdout=subprocess.DEVNULL)
    with open(rep) as f:
        r = json.load(f)
    fu = r["fusion"]
    kern = [k for k in r["kernels"] if k["kind"] != "extern"]
    ext = [k for k in r["kernels"] if k["kind"] == "extern"]
    return {
        "nodes": fu["nodes_before"],
        "rounds": len(fu["rounds"]),
        "after": fu["nodes_after"],
        "kernels": len(kern),
        "externs": len(ext),
        "nests": sum(k["loop_nests"] for k in kern),
        "rejected": sorted({x["reason"] for x in fu["rejected"]}),
        "names": r["calls"],
    }


def top_nests(src):
    """Top-level loop nests of one generated C++ function: the `for`
    statements that no other `for` encloses (Inductor braces every loop
    body)."""
    depth, opened, count = 0, [], 0
    for m in re.finditer(r"\bfor\s*\(|[{}]", src):
        t = m.group(0)
        if t == "{":
            depth += 1
        elif t == "}":
            depth -= 1
            while opened and depth <= opened[-1]:
                opened.pop()
        else:
            count += not opened
            opened.append(depth)
    return count


def inductor_side(spec, tmp, keep=None):
    env = dict(os.environ, TORCH_LOGS="fusion,output_code", TORCHINDUCTOR_FORCE_DISABLE_CACHES="1",
               TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"), OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", CHILD, repr(spec)], env=env, capture_output=True,
                       text=True)
    if p.returncode:
        raise RuntimeError("torch.compile failed:\n" + p.stderr[-2000:])
    log = [re.sub(r"^.*?\[__(fusion|output_code)\] ?", "", l) for l in p.stderr.splitlines()
           if "[__fusion]" in l or "[__output_code]" in l]
    if keep:
        with open(keep, "w") as f:
            f.write("\n".join(log) + "\n")
    nodes, rounds, after = None, 0, None
    for l in log:  # the first scheduler pass, up to "fusion complete"
        m = re.match(r"===== attempting fusion \(1/\d+\): (\d+) nodes", l)
        if m and nodes is None:
            nodes = int(m.group(1))
        m = re.match(r"completed fusion round \(\d+/\d+\): fused \d+ nodes into (\d+) nodes", l)
        if m:
            rounds, after = rounds + 1, int(m.group(1))
        if l.startswith("===== fusion complete"):
            break
    text = "\n".join(log)
    kernels = re.findall(r"^(cpp_fused_\w+) = async_compile", text, re.M)
    bodies = re.split(r"^cpp_fused_\w+ = async_compile", text, flags=re.M)[1:]
    nests = sum(top_nests(b.split("\n''')")[0]) for b in bodies)
    call = text[text.find("def call(") if "def call(" in text else text.find("def _call("):]
    externs = re.findall(r"(extern_kernels\.\w+|torch\.ops\.[\w.]+)\(", call)
    return {
        "nodes": nodes,
        "rounds": rounds,
        "after": after,
        "kernels": len(kernels),
        "externs": len(externs),
        "nests": nests,
        "names": kernels + sorted(set(externs)),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "peers"))
    ap.add_argument("--only", default="")
    ap.add_argument("--doc", default="")
    ap.add_argument("--keep", default="", help="a folder for each program's Inductor log")
    a = ap.parse_args()
    in_venv(a.work)
    import torch

    names = [n for n in EXPERIMENTS if not a.only or n in a.only.split(",")]
    started, load0 = C.now(), C.load()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            e = EXPERIMENTS[name]
            prog, src, inputs = e[0], e[1], e[2]
            weights = e[3] if len(e) > 3 else {}
            if prog is None:
                prog = os.path.join(tmp, name + ".kiln")
                with open(prog, "w") as f:
                    f.write(ATTENTION_KILN)
            else:
                prog = os.path.join(ROOT, prog)
            k = kiln_side(a.kiln, prog, tmp)
            if a.keep:
                os.makedirs(a.keep, exist_ok=True)
            i = inductor_side((src, inputs, weights), tmp,
                              os.path.join(a.keep, name + ".log") if a.keep else None)
            rows.append((name, k, i))
            print("%-12s kiln %s | inductor %s" % (name, {x: k[x] for x in k if x != "rejected"},
                                                    i), flush=True)
    head = ("| program | nodes (kiln / Inductor) | rounds | after | kernels | library calls "
            "| loop nests | kiln's kernels | Inductor's kernels |\n|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for name, k, i in rows:
        cell = lambda f: "%s / %s" % (k[f], i[f])
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            name, cell("nodes"), cell("rounds"), cell("after"), cell("kernels"), cell("externs"),
            cell("nests"), ", ".join(k["names"]), ", ".join(i["names"])))
    table = "\n".join(lines)
    print(table)
    if a.doc:
        m = C.machine()
        hdr = ("Measured by `scripts/vs_inductor.py` (%s to %s): torch %s (PyPI), Inductor's CPU "
               "C++ backend, default mode, one thread; kiln `%s explain`, commit %s; on %s, %s "
               "cores, GCC's -march=native: %s; load average (1, 5, 15 min) at start / end: "
               "%s / %s.\n\n" %
               (started, C.now(), torch.__version__, os.path.relpath(a.kiln, ROOT), C.commit(),
                m["model"], m["cores"], m["march"], load0, C.load()))
        with open(a.doc) as f:
            doc = f.read()
        start, end = "<!-- vs_inductor table: begin -->", "<!-- vs_inductor table: end -->"
        if start not in doc or end not in doc:
            sys.exit("vs_inductor: %s lacks the table's markers" % a.doc)
        doc = doc[:doc.index(start) + len(start)] + "\n" + hdr + table + "\n" + doc[doc.index(end):]
        tmpdoc = a.doc + ".tmp"
        with open(tmpdoc, "w") as f:
            f.write(doc)
        os.replace(tmpdoc, a.doc)


if __name__ == "__main__":
    main()
