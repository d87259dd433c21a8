#!/usr/bin/python3
"""models/onnx_inventory.py -- which ONNX tests and model ops kiln must handle.

  /usr/bin/python3 models/onnx_inventory.py [--data /usr/share/libonnx-testdata/data]
        [--models build/models] [--doc docs/onnx-inventory.md]
        [--list models/onnx_in_scope.txt] [--list-const models/onnx_in_scope_const.txt]

Reads every model.onnx of the four ONNX test folders (node,
pytorch-converted, pytorch-operator, simple; Debian's libonnx-testdata)
and, if given, the models that models/export.py wrote (their manifest.json),
with models/onnx_proto.py (Debian's onnx.proto compiled by protoc; no onnx
package). For each test: op types, default-domain opset, the element types
of the graph's runtime inputs and outputs, and a verdict:

  IN SCOPE     every op in SCOPE_OPS (below) and every input and output
               float32, except int64 where allowed: an index-like tensor
               (Gather indices, a Reshape/Expand/Tile shape, Slice
               starts/ends/axes/steps, Pad pads, Split sizes,
               Squeeze/Unsqueeze/Reduce* axes, ConstantOfShape's shape) that
               is an initializer or a Constant -- directly or through int64
               shape arithmetic (SHAPE_ARITH) -- and ArgMax's output;
  IN SCOPE IF CONST INDICES
               the same, except that an index-like int64 tensor is a graph
               input whose value comes from the test's input_N.pb: in scope
               for a runner that binds those inputs as constants before
               compiling (kiln's shapes are static);
  OUT OF SCOPE with the reasons: ops outside the list (or outside the
               default domain), other element types (bool, int32, float16,
               double, strings, ...), non-tensor inputs (sequences,
               optionals), int64 used as data.

Writes the markdown report (counts per folder, the reasons, the attribute
variants of the in-scope ops, the models' ops, and a per-test table) and
the two lists, one folder/test per line, for a conformance runner.
"""

import argparse
import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import onnx_proto  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ["node", "pytorch-converted", "pytorch-operator", "simple"]

SCOPE_OPS = set("""Add Sub Mul Div Pow Sqrt Exp Log Tanh Sigmoid Relu LeakyRelu Elu Selu
HardSigmoid HardSwish Clip Erf Abs Neg Reciprocal Floor Ceil Max Min Sum Mean Where Equal
Less Greater Not Cast Identity Dropout MatMul Gemm Conv ConvTranspose BatchNormalization
InstanceNormalization LayerNormalization MaxPool AveragePool GlobalAveragePool GlobalMaxPool
Flatten Reshape Transpose Squeeze Unsqueeze Concat Split Slice Gather Expand Pad Tile Shape
Size ConstantOfShape Constant Range Softmax LogSoftmax ReduceSum ReduceMean ReduceMax
ReduceMin ReduceProd ReduceL2 ReduceSumSquare ArgMax PRelu""".split())

# input positions that hold indices, shapes or axes rather than data
_REDUCE = {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2",
           "ReduceSumSquare"}
INDEX_INPUTS = {"Gather": {1}, "Reshape": {1}, "Expand": {1}, "Tile": {1}, "Slice": {1, 2, 3, 4},
                "Pad": {1}, "Split": {1}, "Squeeze": {1}, "Unsqueeze": {1}, "ConstantOfShape": {0},
                **{r: {1} for r in _REDUCE}}
INT_OUTPUT_OPS = {"ArgMax"}
# ops through which an int64 shape value can flow and still be an index
SHAPE_ARITH = {"Add", "Sub", "Mul", "Div", "Concat", "Unsqueeze", "Squeeze", "Gather", "Slice", "Cast",
               "Identity", "Reshape", "Max", "Min", "Neg", "Abs"}
# attributes whose values change what the importer or kernel must do
POOL_LIKE = {"Conv", "ConvTranspose", "MaxPool", "AveragePool"}


# ---- reading a test ---------------------------------------------------------------

def tensor_type(vi):
    """(elem type name, dims or None) of a ValueInfoProto, or (kind, None)
    for sequences, optionals and maps."""
    t = vi.type
    kind = t.WhichOneof("value")
    if kind != "tensor_type":
        return (kind or "untyped").replace("_type", ""), None
    tt = t.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim] \
        if tt.HasField("shape") else None
    return onnx_proto.dtype_name(tt.elem_type), dims


def opset_of(m):
    for o in m.opset_import:
        if o.domain in ("", "ai.onnx"):
            return o.version
    return None


class Test:
    """One model: its ops and I/O, and the verdict."""

    def __init__(self, folder, name, path):
        self.folder, self.name = folder, name
        m = onnx_proto.load_model(path)
        g = m.graph
        self.opset = opset_of(m)
        self.nodes = list(g.node)
        self.ops = collections.Counter(n.op_type if n.domain in ("", "ai.onnx") else
                                       "%s:%s" % (n.domain, n.op_type) for n in g.node)
        self.init = {t.name: onnx_proto.dtype_name(t.data_type) for t in g.initializer}
        self.init_dims = {t.name: list(t.dims) for t in g.initializer}
        self.consts = {o: self._const_type(n) for n in g.node if n.op_type == "Constant" for o in n.output}
        self.inputs = [(vi.name,) + tensor_type(vi) for vi in g.input if vi.name not in self.init]
        self.outputs = [(vi.name,) + tensor_type(vi) for vi in g.output]
        self.shapes = {vi.name: tensor_type(vi)[1] for vi in list(g.input) + list(g.value_info)}
        self.shapes.update(self.init_dims)
        self.verdict, self.reasons = self.classify()
        self.symbolic = any(d is not None and any(not isinstance(x, int) for x in d)
                            for _, _, d in self.inputs + self.outputs)

    @staticmethod
    def _const_type(n):
        for a in n.attribute:
            if a.name == "value":
                return onnx_proto.dtype_name(a.t.data_type)
            if a.name in ("value_int", "value_ints"):
                return "INT64"
            if a.name in ("value_float", "value_floats"):
                return "FLOAT"
        return "?"

    def uses(self, name):
        """(op_type, input position) of every consumer of tensor name."""
        return [(n.op_type, i) for n in self.nodes for i, x in enumerate(n.input) if x == name]

    def index_like(self, name, depth=0):
        """Is tensor name only ever an index, shape or axes -- directly, or
        through shape arithmetic (Shape -> Gather -> Add/Div/Mul -> Slice
        bounds, as torch exports for chunk())? Such int64 math is folded at
        import time once shapes are static."""
        us = [(n, i) for n in self.nodes for i, x in enumerate(n.input) if x == name]
        if not us or depth > 32:
            return False
        for n, i in us:
            if i in INDEX_INPUTS.get(n.op_type, ()):
                continue
            if n.op_type not in SHAPE_ARITH or not all(self.index_like(o, depth + 1) for o in n.output if o):
                return False
        return True

    def producer(self, name):
        for n in self.nodes:
            if name in n.output:
                return n.op_type
        return None

    def classify(self):
        out, const_idx = [], []
        bad_ops = sorted(op for op in self.ops if op not in SCOPE_OPS)
        if bad_ops:
            out.append("ops: " + ", ".join(bad_ops))
        for name, et, _ in self.inputs:
            if et == "FLOAT":
                continue
            if et == "INT64" and self.index_like(name):
                const_idx.append(name)
            else:
                out.append("input %s is %s" % (name, et))
        for name, et in list(self.init.items()) + list(self.consts.items()):
            if et not in ("FLOAT", "INT64") or (et == "INT64" and not self.index_like(name)
                                                 and self.uses(name)):
                out.append("constant %s is %s%s" % (name, et, " data" if et == "INT64" else ""))
        for name, et, _ in self.outputs:
            if et != "FLOAT" and not (et == "INT64" and self.producer(name) in INT_OUTPUT_OPS):
                out.append("output %s is %s" % (name, et))
        if out:
            return "OUT", out
        if const_idx:
            return "CONST", ["int64 index inputs given at run time: " + ", ".join(const_idx)]
        return "IN", []

    def io_text(self, vals):
        return ", ".join("%s %s%s" % (n, short(et), "" if d is None else list(d)) for n, et, d in vals)


def short(et):
    return {"FLOAT": "f32", "INT64": "i64", "INT32": "i32", "BOOL": "bool", "DOUBLE": "f64",
            "FLOAT16": "f16", "STRING": "str", "UINT8": "u8", "INT8": "i8"}.get(et, et.lower())


# ---- attribute variants ----------------------------------------------------------

# attributes whose values are plain numbers the importer passes through
# (their presence matters, not each value); others are listed as name=value
VALUE_ONLY = {"kernel_shape", "epsilon", "alpha", "beta", "gamma", "momentum", "seed", "ratio",
              "min", "max", "value", "value_float", "value_floats", "value_int", "value_ints",
              "consumed_inputs"}


def attr_feature(op, name, v):
    """One attribute as a feature string that matters, or None."""
    if name in VALUE_ONLY:
        return None
    if name == "strides":
        return "strided" if any(x != 1 for x in v) else None
    if name == "dilations":
        return "dilated" if any(x != 1 for x in v) else None
    if name == "pads":
        return "padded" if any(v) else None
    if name == "group":
        return "grouped" if v != 1 else None
    if name in ("output_padding", "output_shape"):
        return name if any(v) else None
    if name == "to":
        return "to=" + onnx_proto.dtype_name(v)
    if isinstance(v, list) and len(v) > 8:
        v = "[%d values]" % len(v)
    return "%s=%s" % (name, v)


def node_features(t, n):
    """What matters about one node: its categorical attributes, strides,
    dilation, groups, padding (asymmetric or not), spatial rank, negative
    axes, extra outputs, where its index inputs come from."""
    feats = []
    for a in n.attribute:
        v = onnx_proto.attr_value(a)
        if a.name == "pads" and isinstance(v, list) and v[:len(v) // 2] != v[len(v) // 2:]:
            feats.append("asymmetric pads")
        if a.name in ("axis", "axes") and (v < 0 if isinstance(v, int) else any(x < 0 for x in v)):
            feats.append("negative %s" % a.name)
        f = attr_feature(n.op_type, a.name, v)
        if f:
            feats.append(f)
    rank = spatial_rank(t, n)
    if rank is not None:
        feats.append("%dD" % rank)
    if len([o for o in n.output if o]) > 1 and n.op_type not in ("Split",):
        feats.append("%d outputs" % len([o for o in n.output if o]))
    for i in sorted(INDEX_INPUTS.get(n.op_type, ())):
        if i < len(n.input) and n.input[i]:
            src = "initializer" if n.input[i] in t.init else "Constant" if n.input[i] in t.consts else \
                "runtime input" if any(n.input[i] == x[0] for x in t.inputs) else "computed"
            feats.append("input %d %s" % (i, src))
    return feats


def spatial_rank(t, n):
    """Spatial dims of a conv or pool: from kernel_shape, the weight, or
    the input's shape (None where unknown or not a conv/pool)."""
    if not (n.op_type in POOL_LIKE or n.op_type.startswith("Global")):
        return None
    for a in n.attribute:
        if a.name == "kernel_shape":
            return len(a.ints)
    for i in ((1, 0) if n.op_type.startswith("Conv") else (0,)):
        d = t.shapes.get(n.input[i]) if i < len(n.input) else None
        if d:
            return len(d) - 2
    return None


def variants(tests):
    """op -> Counter of feature -> number of tests using it."""
    v = collections.defaultdict(collections.Counter)
    for t in tests:
        seen = set()
        for n in t.nodes:
            v[n.op_type]  # every op appears, even without attributes
            for f in node_features(t, n) + ["opset %d" % t.opset]:
                if (n.op_type, f) not in seen:
                    seen.add((n.op_type, f))
                    v[n.op_type][f] += 1
    return v


# ---- report ---------------------------------------------------------------------

def scan(data):
    tests = []
    for folder in FOLDERS:
        d = os.path.join(data, folder)
        for name in sorted(os.listdir(d)):
            p = os.path.join(d, name, "model.onnx")
            if os.path.exists(p):
                tests.append(Test(folder, name, p))
    return tests


def folder_counts(tests):
    rows = []
    for f in FOLDERS + ["all"]:
        ts = [t for t in tests if f in ("all", t.folder)]
        c = collections.Counter(t.verdict for t in ts)
        ops = sorted({t.opset for t in ts if t.opset})
        rows.append("| %s | %d | %d | %d | %d | %s |" % (
            f, len(ts), c["IN"], c["CONST"], c["OUT"], "%d..%d" % (ops[0], ops[-1]) if ops else "-"))
    return ["| folder | tests | in scope | in scope if const indices | out of scope | opsets |",
            "|---|---|---|---|---|---|"] + rows


def reason_kinds(t):
    """The distinct blockers of one out-of-scope test: 'op X' for each op,
    'INT64 input', 'BOOL output', 'INT64 data constant', ..."""
    kinds = set()
    for r in t.reasons:
        if r.startswith("ops: "):
            kinds.update("op " + op for op in r[5:].split(", "))
        else:
            kinds.add("%s %s" % (r.split(" is ", 1)[1], r.split(" ", 1)[0]))
    return kinds


def reason_counts(tests):
    """Counters over out-of-scope tests: ops, I/O kinds, and the tests
    blocked by a single thing."""
    ops, types, single = collections.Counter(), collections.Counter(), collections.Counter()
    for t in tests:
        if t.verdict != "OUT":
            continue
        kinds = reason_kinds(t)
        for k in kinds:
            (ops if k.startswith("op ") else types)[k[3:] if k.startswith("op ") else k] += 1
        if len(kinds) == 1:
            single[kinds.pop()] += 1
    return ops, types, single


def fmt_counter(c, limit=None):
    items = c.most_common(limit)
    return ", ".join("%s (%d)" % (k, v) for k, v in items) or "-"


def model_section(models_dir):
    mf = os.path.join(models_dir, "manifest.json")
    if not os.path.exists(mf):
        return ["(no %s: run models/export.py first; this section is empty)" % mf, ""]
    out = []
    for e in json.load(open(mf))["models"]:
        t = Test("models", e["model"], os.path.join(models_dir, e["onnx"]))
        out += ["### %s (opset %d, %s)" % (e["model"], t.opset, t.verdict.replace("IN", "in scope")
                                           .replace("CONST", "in scope if const indices")
                                           .replace("OUT", "OUT OF SCOPE: " + "; ".join(t.reasons))),
                "", "| op | nodes | attributes and variants (nodes) |", "|---|---|---|"]
        feats = collections.defaultdict(collections.Counter)
        for n in t.nodes:
            for f in node_features(t, n):
                feats[n.op_type][f] += 1
        for op, cnt in sorted(t.ops.items()):
            out.append("| %s | %d | %s |" % (op, cnt, fmt_counter(feats[op])))
        out.append("")
    return out


def write_doc(path, a, tests, cmdline):
    ins = [t for t in tests if t.verdict == "IN"]
    const = [t for t in tests if t.verdict == "CONST"]
    ops, types, single = reason_counts(tests)
    L = ["# ONNX inventory: the ONNX backend tests and the real models",
         "",
         "Generated by `%s` (models/onnx_inventory.py; do not edit by hand)." % cmdline,
         "Test data: Debian's libonnx-testdata 1.12 (`%s`); models: models/export.py." % a.data,
         "",
         "Scope rule: every op in kiln's ONNX op list (models/onnx_inventory.py SCOPE_OPS) and every",
         "graph input and output float32; int64 only for index-like tensors (Gather indices,",
         "Reshape/Expand/Tile shapes, Slice starts/ends/axes/steps, Pad pads, Split sizes,",
         "Squeeze/Unsqueeze/Reduce* axes, ConstantOfShape's shape) that are initializers or",
         "Constants (directly or through int64 shape arithmetic: Add/Sub/Mul/Div/Concat/Gather/...",
         "ending in such an input, as torch exports for chunk() in the encoder), and for ArgMax's",
         "output. Tests whose index-like int64 tensors are graph inputs",
         "(fed from test_data_set_*/input_N.pb) are counted apart: a runner that binds those as",
         "constants before compiling can run them. The `real` folder (ResNet-50, VGG, ...",
         "with external weights not shipped) is not scanned.",
         "",
         "Lists for a conformance runner (one `folder/test` per line): `%s` (in scope, %d tests)"
         % (os.path.relpath(a.list, ROOT), len(ins)),
         "and `%s` (in scope if the int64 index inputs are bound as constants, %d tests)."
         % (os.path.relpath(a.list_const, ROOT), len(const)),
         "",
         "## Counts", ""] + folder_counts(tests) + [
         "",
         "In-scope tests (both lists) per opset: " + ", ".join(
             "%s: %d" % (k, v) for k, v in sorted(collections.Counter(t.opset for t in ins + const).items())),
         "Older opsets carry older forms: below 7, `broadcast=1` on binary ops and BatchNormalization",
         "`is_test`/`spatial`; below 10, Slice starts/ends as attributes; below 11, Pad's pads as an",
         "attribute; below 13, Split's split, Squeeze/Unsqueeze/ReduceSum axes as attributes and",
         "Softmax/LogSoftmax flattening to 2D at `axis`; the other Reduce* ops take axes as an",
         "attribute up to opset 17 (the newest here).",
         "In-scope tests with symbolic (named) input or output dims: %d." % sum(t.symbolic for t in ins + const),
         "",
         "## Why tests are out of scope", "",
         "- ops outside the list (tests using each): " + fmt_counter(ops),
         "- element types and other I/O reasons (tests): " + fmt_counter(types),
         "- tests blocked by exactly one thing (the cheapest to bring in): " + fmt_counter(single, 40),
         "- tests blocked only by bool inputs, outputs or constants (in scope if bool I/O were "
         "allowed; Equal, Less, Greater, Not and Where produce or take bool): %d" % sum(
             1 for t in tests if t.verdict == "OUT" and all(k.startswith("BOOL ") for k in reason_kinds(t))),
         "",
         "## The real models", ""] + model_section(a.models) + [
         "## Attribute variants of the in-scope tests",
         "",
         "Per op, with the number of in-scope tests (both lists) using each: the opsets; the",
         "categorical attributes as name=value (auto_pad, ceil_mode, count_include_pad,",
         "storage_order, keepdims, transA/transB, mode, axis, ...); `strided`, `dilated`,",
         "`grouped`, `padded` and `asymmetric pads` (begin != end on some axis; the test named",
         "conv_with_strides_and_asymmetric_padding has pads [1, 0, 1, 0], different per axis but",
         "begin = end; auto_pad=SAME_UPPER/SAME_LOWER implies begin != end whenever the total",
         "padding is odd) where those are not trivial; the spatial rank",
         "(`1D/2D/3D`; kiln's conv2d and pools are 2D, so 1D and 3D need a reshape to 2D or",
         "kernels of their own); `N outputs` where an op has optional outputs in use (e.g.",
         "LayerNormalization's Mean and InvStdDev, BatchNormalization in training mode); where",
         "index inputs come from (initializer, Constant, runtime input, computed). Plain numeric",
         "values (epsilon, alpha, kernel sizes, Clip bounds) are left out.",
         "", "| op | tests | variants (tests) |", "|---|---|---|"]
    v = variants(ins + const)
    per_op = collections.Counter(op for t in ins + const for op in t.ops)
    for op in sorted(v):
        L.append("| %s | %d | %s |" % (op, per_op[op], fmt_counter(v[op])))
    unused = sorted(SCOPE_OPS - set(per_op))
    L += ["", "Listed ops no in-scope test uses: " + (", ".join(unused) or "none"), "",
          "## Every test", "",
          "Verdict: IN, CONST (in scope if const indices) or OUT with the reasons. Inputs are the",
          "graph inputs that are not initializers.", "",
          "| test | opset | ops | inputs | outputs | verdict |", "|---|---|---|---|---|---|"]
    for t in tests:
        L.append("| %s/%s | %s | %s | %s | %s | %s |" % (
            t.folder, t.name, t.opset, " ".join(sorted(t.ops)), t.io_text(t.inputs), t.io_text(t.outputs),
            t.verdict + (": " + "; ".join(t.reasons) if t.reasons else "") +
            (" (symbolic dims)" if t.symbolic else "")))
    with open(path, "w") as f:
        f.write("\n".join(L).replace("|  |", "| - |") + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="/usr/share/libonnx-testdata/data")
    ap.add_argument("--models", default=os.path.join(ROOT, "build", "models"))
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "onnx-inventory.md"))
    ap.add_argument("--list", default=os.path.join(ROOT, "models", "onnx_in_scope.txt"))
    ap.add_argument("--list-const", default=os.path.join(ROOT, "models", "onnx_in_scope_const.txt"))
    a = ap.parse_args()
    tests = scan(a.data)
    for path, verdict in ((a.list, "IN"), (a.list_const, "CONST")):
        with open(path, "w") as f:
            f.writelines("%s/%s\n" % (t.folder, t.name) for t in tests if t.verdict == verdict)
    cmdline = "/usr/bin/python3 models/onnx_inventory.py" + (
        "" if a.models == ap.get_default("models") else " --models " + a.models)
    write_doc(a.doc, a, tests, cmdline)
    c = collections.Counter(t.verdict for t in tests)
    print("onnx_inventory: %d tests: %d in scope, %d in scope if const indices, %d out; wrote %s, %s, %s"
          % (len(tests), c["IN"], c["CONST"], c["OUT"], a.doc, a.list, a.list_const), file=sys.stderr)


if __name__ == "__main__":
    main()
