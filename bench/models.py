#!/usr/bin/python3
"""bench/models.py -- whole models, kiln beside ONNX Runtime, side by side.

  /usr/bin/python3 bench/models.py [--only resnet18,...] [--threads 1,2]
      [--batch 1,8] [--repeat 20] [--rounds 3] [--quick] [--doc FILE]
      [--profile DIR]

The models: resnet18, mobilenet_v2 and the transformer encoder layer of
models/export.py (random weights; batch 1 and, as NAME_b8.onnx, batch 8;
exported into build/models/ first if missing), and the real trained
models of models/real.py (PyPI wheels, batch 1 at the shapes real.py
gives them; ddddocr_old is left out: kiln refuses its ORT-only op).

For each model, thread count and batch, each peer runs in a process of
its own, in turns (kiln first in odd rounds, ONNX Runtime first in even
ones), --rounds times; each process makes a warm-up run and then
--repeat timed runs, and its median is kept; the table gives the best
median of the rounds for each peer:

  kiln  `kiln bench MODEL --fused-only --fixed-threads --threads T`: the
        compiled program run into outputs allocated once (the JIT cache
        is warm after the first round, as for a deployed model)
  ORT   onnxruntime (PyPI, the venv models/real.py makes), run by
        bench/ort_run.py: graph optimizations at ORT_ENABLE_ALL, intra-op
        threads T, inter-op 1, the same inputs; its time is the median of
        runs into outputs preallocated once (an IOBinding, as kiln's are
        allocated once), or of plain session.run calls where binding fails

OPENBLAS_CORETYPE is removed from the peers' environment unless
--keep-blas-env (the header says what it was): some machine images set it
(Haswell on the AMD EPYC Zen 5 these numbers were taken on, where
OpenBLAS's own choice is Cooperlake and runs the encoder's GEMMs 1.7x
faster); OpenBLAS then picks its own core, or kiln does (matmul.c).

Peak resident memory is each process's own high-water mark (Linux's
VmHWM, read by the process itself at its end: wait4's ru_maxrss would
count the forking Python's memory too), the largest over the rounds: for
kiln the whole CLI process (`kiln bench --report`'s peak_rss_kib: the
program, its weights and their blocked copies, inputs and outputs); for
ORT the Python process with numpy and the session. Compile time is not
in the run times.

--profile DIR also writes `kiln bench --profile` output and ORT's own
profile (enable_profiling, per-node times summed by op type) for each
configuration into DIR. --quick: one round, --repeat 10, batch 1 only.
Run nothing else CPU-heavy meanwhile; the header says what else ran.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "models"))
import real  # noqa: E402  (models/real.py: the venv, the wheels, the inputs)

EXPORTED = ["resnet18", "mobilenet_v2", "encoder"]
SKIP_REAL = {"ddddocr_old"}  # com.microsoft.DynamicQuantizeLSTM: refused by kiln

ORT_RUN = os.path.join(HERE, "ort_run.py")  # the ORT runner bench/compare uses too


PEER_ENV = dict(os.environ)


def run_measured(args, env=None):
    """Run args; -> (returncode, stdout, stderr, max RSS in MiB)."""
    with tempfile.TemporaryFile() as so, tempfile.TemporaryFile() as se:
        p = subprocess.Popen(args, stdout=so, stderr=se, env=env or PEER_ENV)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        so.seek(0)
        se.seek(0)
        return p.returncode, so.read().decode(), se.read().decode(), ru.ru_maxrss / 1024.0


def kiln_once(kiln, path, feeds, threads, repeat, work, profile_to=None):
    rep = os.path.join(work, "kiln_report.json")
    args = [kiln, "bench", path, "--fused-only", "--fixed-threads", "--threads", str(threads),
            "--repeat", str(repeat), "--report", rep]
    for k, f in feeds.items():
        args += ["-i", "%s=%s" % (k, f)]
    if profile_to:
        args.append("--profile")
    rc, out, err, rss = run_measured(args)
    if rc:
        return {"error": (err or out).strip().splitlines()[-1][:200]}
    with open(rep) as f:
        r = json.load(f)
    if profile_to:
        with open(profile_to, "w") as f:
            f.write(out)
    return {"ms": r["fused_ms"], "rss": r["peak_rss_kib"] / 1024.0, "compile_ms": r["compile_ms"]}


def ort_once(py, path, feeds, threads, repeat, profile_to=None):
    args = [py, ORT_RUN, path, str(threads), str(repeat), "-"]
    if profile_to:
        args += ["--profile", profile_to + ".ort"]
    args += ["%s=%s" % kv for kv in feeds.items()]
    rc, out, err, rss = run_measured(args)
    if rc:
        return {"error": (err or out).strip().splitlines()[-1][:200]}
    r = json.loads(out.strip().splitlines()[-1])
    if profile_to:
        summarize_ort_profile(r["profile"], profile_to)
        os.remove(r["profile"])
    ms = r["prealloc_median_ms"] if r["prealloc_median_ms"] is not None else r["plain_median_ms"]
    return {"ms": ms, "plain_ms": r["plain_median_ms"], "rss": r["rss_kib"] / 1024.0}


def summarize_ort_profile(trace, dst):
    """ORT's profile (Chrome trace JSON): node times summed by op type,
    over the timed runs (the warm-up's first run left out)."""
    with open(trace) as f:
        ev = json.load(f)
    runs = [e for e in ev if e.get("cat") == "Session" and e.get("name") == "model_run"]
    start = runs[1]["ts"] if len(runs) > 1 else 0
    by_op, nodes = {}, {}
    for e in ev:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time") or e["ts"] < start:
            continue
        op = e.get("args", {}).get("op_name", "?")
        by_op[op] = by_op.get(op, 0) + e["dur"]
        nodes[e["name"]] = (op, nodes.get(e["name"], (op, 0))[1] + e["dur"])
    n = max(1, len(runs) - 1)
    total = sum(by_op.values()) or 1
    with open(dst + ".ort.txt", "w") as f:
        f.write("ONNX Runtime: node time by op type, ms per run over %d runs\n" % n)
        for op, us in sorted(by_op.items(), key=lambda kv: -kv[1]):
            f.write("%-28s %9.4f %6.1f%%\n" % (op, us / 1e3 / n, 100 * us / total))
        f.write("\nslowest nodes\n")
        for name, (op, us) in sorted(nodes.items(), key=lambda kv: -kv[1][1])[:25]:
            f.write("%-60s %-20s %9.4f\n" % (name[:60], op, us / 1e3 / n))


def configs(np, a, work):
    """-> [(name, batch, onnx path, {input: npy file})]"""
    out = []
    mdir = os.path.join(ROOT, "build", "models")
    want = a.only.split(",") if a.only else None
    if any(not want or n in want for n in EXPORTED):
        if not all(os.path.exists(os.path.join(mdir, n + "_b8.onnx")) for n in EXPORTED):
            subprocess.check_call(["/usr/bin/python3", os.path.join(ROOT, "models", "export.py"),
                                   mdir])
    for n in EXPORTED:
        if want and n not in want:
            continue
        for b in a.batch:
            stem = n if b == 1 else "%s_b%d" % (n, b)
            if os.path.exists(os.path.join(mdir, stem + ".onnx")):
                out.append((n, b, os.path.join(mdir, stem + ".onnx"),
                            {"input": os.path.join(mdir, stem + "_input.npy")}))
    if 1 in a.batch:
        rdir = real.fetch(a.work, real.venv_python(a.work))
        for n, (_, _, _, spec) in real.MODELS.items():
            if n in SKIP_REAL or (want and n not in want):
                continue
            vals = real.make_inputs(np, spec, 20261202)
            feeds = {}
            for k, v in vals.items():
                f = os.path.join(work, "%s_in_%s.npy" % (n, real.safe(k)))
                np.save(f, v)
                feeds[k] = f
            out.append((n, 1, os.path.join(rdir, n + ".onnx"), feeds))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "real"))
    ap.add_argument("--only", default="")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--doc", default="")
    ap.add_argument("--profile", default="")
    ap.add_argument("--keep-blas-env", action="store_true")
    a = ap.parse_args()
    blas_env = os.environ.get("OPENBLAS_CORETYPE")
    if not a.keep_blas_env:
        PEER_ENV.pop("OPENBLAS_CORETYPE", None)
    a.work = os.path.abspath(a.work)
    a.threads = [int(t) for t in a.threads.split(",")]
    a.batch = [int(b) for b in a.batch.split(",")]
    if a.quick:
        a.rounds, a.repeat, a.batch = 1, 10, [1]
    import numpy as np
    py = real.ensure_venv(a.work)
    ortv = subprocess.run([py, "-c", "import onnxruntime; print(onnxruntime.__version__)"],
                          capture_output=True, text=True).stdout.strip()
    kiln = os.path.abspath(a.kiln)
    work = tempfile.mkdtemp(prefix="kiln-models-")
    if a.profile:
        os.makedirs(a.profile, exist_ok=True)
    rows = []
    print("bench/models.py: kiln vs ONNX Runtime %s, %d round(s) of a warm-up and %d runs each"
          % (ortv, a.rounds, a.repeat), flush=True)
    print("OPENBLAS_CORETYPE: %s%s" % (blas_env or "unset", "" if a.keep_blas_env or not blas_env
                                        else " in this environment, removed for the peers"))
    print("%-18s %5s %3s %10s %10s %7s %9s %9s" % ("model", "batch", "thr", "kiln ms", "ORT ms",
                                                   "ORT/kiln", "kiln MiB", "ORT MiB"), flush=True)
    for name, batch, path, feeds in configs(np, a, work):
        for t in a.threads:
            best = {"kiln": None, "ort": None}
            rss = {"kiln": 0.0, "ort": 0.0}
            err = None
            for r in range(a.rounds):
                order = ["kiln", "ort"] if r % 2 == 0 else ["ort", "kiln"]
                for peer in order:
                    prof = (os.path.join(a.profile, "%s_b%d_t%d" % (name, batch, t))
                            if a.profile and r == a.rounds - 1 else None)
                    if peer == "kiln":
                        m = kiln_once(kiln, path, feeds, t, a.repeat, work,
                                      prof + ".kiln.txt" if prof else None)
                    else:
                        m = ort_once(py, path, feeds, t, a.repeat, prof)
                    if "error" in m:
                        err = "%s: %s" % (peer, m["error"])
                        continue
                    best[peer] = m["ms"] if best[peer] is None else min(best[peer], m["ms"])
                    rss[peer] = max(rss[peer], m["rss"])
            row = {"model": name, "batch": batch, "threads": t, "kiln_ms": best["kiln"],
                   "ort_ms": best["ort"], "kiln_rss": rss["kiln"], "ort_rss": rss["ort"],
                   "error": err}
            rows.append(row)
            if best["kiln"] and best["ort"]:
                print("%-18s %5d %3d %10.3f %10.3f %7.2fx %9.0f %9.0f" % (
                    name, batch, t, best["kiln"], best["ort"], best["ort"] / best["kiln"],
                    rss["kiln"], rss["ort"]), flush=True)
            else:
                print("%-18s %5d %3d  %s" % (name, batch, t, err), flush=True)
    ok = [r for r in rows if r["kiln_ms"] and r["ort_ms"]]
    if ok:
        import math
        geo = math.exp(sum(math.log(r["ort_ms"] / r["kiln_ms"]) for r in ok) / len(ok))
        ahead = sum(r["kiln_ms"] <= r["ort_ms"] for r in ok)
        print("kiln at or ahead of ORT in %d of %d; geo-mean ORT/kiln %.2fx" % (ahead, len(ok), geo))
    if a.doc:
        with open(a.doc + ".tmp", "w") as f:
            json.dump({"ort": ortv, "rounds": a.rounds, "repeat": a.repeat, "rows": rows}, f, indent=1)
        os.rename(a.doc + ".tmp", a.doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
