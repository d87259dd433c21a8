"""Helpers shared by bench/run and bench/compare: building kiln and the
bandwidth probe, machine facts, the copy bandwidth, docs/benchmarks.md
sections."""

import datetime
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
DOC = os.path.join(ROOT, "docs", "benchmarks.md")
BUILD = "build-bench"


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, **kw)


def build_kiln(kiln=None):
    """Build kiln in build-bench/ (other builds are left alone) unless a
    binary was given; returns its absolute path."""
    if kiln:
        return os.path.abspath(kiln)
    log("bench: make BUILD=%s %s/kiln" % (BUILD, BUILD))
    r = subprocess.run(["make", "--no-print-directory", "BUILD=" + BUILD, BUILD + "/kiln"],
                       cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode:
        sys.exit("bench: building kiln failed:\n" + r.stdout[-4000:])
    return os.path.join(ROOT, BUILD, "kiln")


def build_ktime(tmp, kiln, march=("-march=native",), suffix=""):
    """bench/ktime.c against the libkiln.a next to the kiln binary; None
    (and a note) when it does not build. march: the flags its own code
    (the paired copy loop) is compiled with, e.g. a target tier's."""
    return build_api_tool(tmp, kiln, "ktime", "the outputs-reused column is left out", march, suffix)


def build_api_tool(tmp, kiln, name, missing, march=("-march=native",), suffix="", testing=False):
    """bench/NAME.c, a program on kiln's API, against the libkiln.a next to
    the kiln binary (testing: libkiln_testing.a, the library with the test
    hooks of src/testing.h); None (and a note saying `missing`) when it does
    not build."""
    libname = "libkiln_testing.a" if testing else "libkiln.a"
    lib = os.path.join(os.path.dirname(kiln), libname)
    exe = os.path.join(tmp, name + suffix)
    if not os.path.exists(lib) and os.path.dirname(kiln) == os.path.join(ROOT, BUILD):
        subprocess.run(["make", "--no-print-directory", "BUILD=" + BUILD, BUILD + "/" + libname],
                       cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    arch = subprocess.run(["cc", "-print-multiarch"], stdout=subprocess.PIPE, text=True).stdout.strip() \
        or "x86_64-linux-gnu"
    blas = "/usr/lib/%s/openblas-openmp" % arch
    r = subprocess.run(["cc", "-O3", *march, "-std=c11", "-D_GNU_SOURCE", "-fopenmp",
                        *(["-DKILN_TESTING"] if testing else []), "-I", os.path.join(ROOT, "include"), "-I", os.path.join(ROOT, "src"),
                        os.path.join(BENCH, name + ".c"), lib, "-L" + blas, "-Wl,-rpath," + blas,
                        "-lopenblas", "-ldnnl", "-lprotobuf-c", "-lm", "-ldl", "-o", exe],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode:
        log("bench: bench/%s.c does not build (%s):\n%s" % (name, missing, r.stdout[-2000:]))
        return None
    return exe


def ktime(exe, prog, threads, repeat, inputs=None, env=None, reuse=True, paired_copy=None):
    """The fused run via the API with outputs reused: {median_ms, min_ms,
    faults_per_run} or {"error": ...}. paired_copy=MIB also times bw.c's
    copy loop over two MIB buffers before each run, in the same process
    ({copy_gbs, copy_gbs_median}: the yardstick measured side by side)."""
    if not exe:
        return {"error": ["no ktime"]}
    cmd = [exe, prog, "--threads", str(threads), "--repeat", str(repeat)] + (["--reuse"] if reuse else [])
    if paired_copy:
        cmd += ["--paired-copy", str(paired_copy)]
    for n, p in (inputs or {}).items():
        cmd += ["-i", "%s=%s" % (n, p)]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if r.returncode:
        return {"error": (r.stderr or r.stdout).strip().splitlines()[-1:] or ["exit %d" % r.returncode]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def set_wait_policy(policy):
    """OMP_WAIT_POLICY for this process and its children (kiln, torch):
    must happen before libgomp is loaded (before importing torch). On a
    shared, oversubscribed machine libgomp's default spin-wait costs every
    parallel region a scheduler tick (see docs/benchmarks.md)."""
    if policy and policy != "default":
        os.environ["OMP_WAIT_POLICY"] = policy.upper()
    else:
        os.environ.pop("OMP_WAIT_POLICY", None)
    return os.environ.get("OMP_WAIT_POLICY", "default (unset)")


def build_bw(tmp):
    exe = os.path.join(tmp, "bw")
    sh(["cc", "-O3", "-march=native", "-fopenmp", "-o", exe, os.path.join(BENCH, "bw.c")])
    return exe


def bandwidth(bw_exe, mib, reps, threads=(1, 2), kinds="copy,memcpy,read,fresh"):
    """{threads: {"copy": GB/s, "memcpy": ..., "read": ..., "fresh": ...}}, best of
    reps, and "<kind>_median" the median of the reps."""
    out = sh([bw_exe, "--mib", str(mib), "--reps", str(reps), "--json", "--kind", kinds,
              "--threads", ",".join(map(str, threads))]).stdout
    res = {}
    for r in json.loads(out):
        res.setdefault(r["threads"], {})[r["kind"]] = r["gbs"]
        res[r["threads"]][r["kind"] + "_median"] = r.get("gbs_median", r["gbs"])
    return res


def merge_best(a, b):
    """Keep the best figure of two bandwidth measurements (b may hold only
    some kinds: a spot check of the copy bandwidth)."""
    if not a:
        return b
    return {t: {k: max(a[t][k], b.get(t, {}).get(k, 0)) for k in a[t]} for t in a}


def spot_bandwidth(bw_exe, bw, mib, threads):
    """Re-measure the copy bandwidth (3 runs) and keep the best seen: on a
    shared machine one measurement at the start can land in a busy moment."""
    return merge_best(bw, bandwidth(bw_exe, mib, 3, threads, kinds="copy"))


def machine():
    model, cores, l3 = "?", os.cpu_count(), "?"
    try:
        for line in sh(["lscpu"]).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
            if line.startswith("L3 cache:"):
                l3 = line.split(":", 1)[1].strip()
    except Exception:
        pass
    march = "?"   # what GCC's -march=native resolves to (its tuning decides vector widths)
    try:
        for line in sh(["cc", "-march=native", "-Q", "--help=target"]).stdout.splitlines():
            if line.strip().startswith("-march="):
                march = line.split()[-1]
                break
    except Exception:
        pass
    mem = "?"
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = "%.1f GiB" % (int(line.split()[1]) / 1048576)
    return {"model": model, "cores": cores, "memory": mem, "l3": l3, "march": march}


def commit():
    try:
        c = sh(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT).stdout.strip()
        dirty = sh(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT).stdout.strip()
        return c + (" + uncommitted changes" if dirty else "")
    except Exception:
        return "?"


def torch_venv(work=None):
    """The python of WORK/venv (default build/peers/venv) with torch 2.x and
    numpy from PyPI, made when missing (a large download the first time,
    then reused): bench/compare's torch.compile and scripts/vs_inductor.py.
    Raises OSError or CalledProcessError when pip fails."""
    venv = os.path.join(work or os.path.join(ROOT, "build", "peers"), "venv")
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        log("making %s with torch from PyPI (a large download)" % venv)
        subprocess.check_call([sys.executable, "-m", "venv", venv])
        subprocess.check_call([py, "-m", "pip", "install", "-q", "torch", "numpy"])
    return py


def peer_packages(py, wanted):
    """Install into the venv of py (torch_venv's) the PyPI packages of the
    peers in wanted that do not import yet (openvino; jax; apache-tvm with
    onnx for its ONNX frontend). Returns {peer: why it cannot run} for those
    that still do not import."""
    pkgs = {"openvino": (["openvino"], ["openvino"]), "jax": (["jax"], ["jax"]),
            "tvm": (["tvm", "onnx"], ["apache-tvm", "onnx"])}

    def imports(mods):
        return subprocess.run([py, "-c", "import " + ", ".join(mods)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    missing = [p for p in wanted if imports(pkgs[p][0]).returncode]
    if missing:
        log("installing %s into %s from PyPI" % (", ".join(missing), os.path.dirname(os.path.dirname(py))))
        subprocess.run([py, "-m", "pip", "install", "-q"] + sum((pkgs[p][1] for p in missing), []))
    why = {}
    for p in missing:
        r = imports(pkgs[p][0])
        if r.returncode:
            why[p] = "does not import: " + ((r.stdout.strip().splitlines() or ["?"])[-1])
    return why


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def now():
    return datetime.datetime.now().strftime("%Y-%m-%d %H:%M")


def header_lines(m, started, ended, loads):
    return [
        "- date: %s to %s" % (started, ended),
        "- machine: %s, %s cores, %s memory, L3 %s; GCC's -march=native: %s" % (
            m["model"], m["cores"], m["memory"], m["l3"], m.get("march", "?")),
        "- kiln: commit %s" % commit(),
        "- load average (1, 5, 15 min) at start / end: %s / %s" % (loads[0], loads[-1]),
        "- OMP_WAIT_POLICY: %s (kiln's kernels, OpenBLAS and torch share libgomp)"
        % os.environ.get("OMP_WAIT_POLICY", "default (unset)"),
    ]


def write_section(name, text):
    """Replace the text between <!-- NAME begin --> and <!-- NAME end --> in
    docs/benchmarks.md, appending the section if it is not there."""
    begin, end = "<!-- %s begin -->" % name, "<!-- %s end -->" % name
    doc = open(DOC).read() if os.path.exists(DOC) else "# Benchmarks\n"
    block = "%s\n%s\n%s" % (begin, text.rstrip(), end)
    if begin in doc and end in doc:
        doc = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, doc, flags=re.S)
    else:
        doc = doc.rstrip() + "\n\n" + block + "\n"
    tmp = DOC + ".tmp"
    with open(tmp, "w") as f:
        f.write(doc)
    os.replace(tmp, DOC)


def md_table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(out)


def text_table(head, rows):
    w = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    fmt = lambda r: "  ".join(str(c).rjust(w[i]) if i else str(c).ljust(w[i]) for i, c in enumerate(r))
    return "\n".join([fmt(head), fmt(["-" * x for x in w])] + [fmt(r) for r in rows])


def kiln_bench(kiln, prog, threads, repeat, report, inputs=None, env=None, extra=()):
    """Run kiln bench; returns its JSON report, normalized: fused_ms,
    interp_ms (the reference interpreter), kernels_ms (unfused compiled
    kernels, None if this kiln has no such baseline), compile_ms, bytes_*."""
    cmd = [kiln, "bench", prog, "--threads", str(threads), "--repeat", str(repeat),
           "--report", report] + list(extra)
    for n, p in (inputs or {}).items():
        cmd += ["-i", "%s=%s" % (n, p)]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if r.returncode:
        return {"error": (r.stderr or r.stdout).strip().splitlines()[-1:] or ["exit %d" % r.returncode]}
    j = json.load(open(report))
    if "interp_ms" in j:          # newer kiln: unfused_ms is the unfused kernels
        j["kernels_ms"] = j.get("unfused_kernels_ms", j["unfused_ms"])
    else:                         # older kiln: unfused_ms is the interpreter
        j["interp_ms"] = j["unfused_ms"]
        j["kernels_ms"] = j.get("unfused_kernels_ms")
    return j


def fmt_ms(x):
    if x is None:
        return "-"
    return "%.3f" % x if x < 1 else "%.2f" % x if x < 100 else "%.1f" % x


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2
