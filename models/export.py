#!/usr/bin/python3
"""models/export.py -- export three real models to ONNX with PyTorch's
output beside each.

  /usr/bin/python3 models/export.py [OUTDIR] [--only resnet18,...] [--no-op17]

OUTDIR defaults to build/models/ (not committed: resnet18 alone is 45 MB).
Needs Debian's python3-torch (1.13) and python3-torchvision (0.14); nothing
is downloaded: every weight is random, drawn from fixed seeds.

The models (batch 1, and batch 8 beside, eval mode):
  resnet18      torchvision resnet18, input 1x3x224x224, output 1x1000
  mobilenet_v2  torchvision mobilenet_v2, input 1x3x224x224, output 1x1000
  encoder       nn.TransformerEncoderLayer(d_model 256, nhead 4,
                dim_feedforward 1024, batch_first=True), input 1x128x256

Random weights that still behave like a trained network: BatchNorm and
LayerNorm scales and shifts are drawn away from 1 and 0, and BatchNorm's
running statistics are measured on a few random batches (train mode,
cumulative average), so activations stay near unit scale through the
network, the folded Conv-BN weights are not a no-op, and the logits are
O(1) rather than overflowing or vanishing.

What is written, for each model NAME:
  NAME.onnx         opset 13 (standard ops only)
  NAME_op17.onnx    (encoder only, unless --no-op17) opset 17: the same
                    layer with LayerNormalization as one op instead of its
                    opset-13 decomposition (ReduceMean, Sub, Pow, Sqrt, Div)
  NAME_b8.onnx      (unless --no-batch8) the same model at batch 8, with
                    NAME_b8_input.npy (the batch-1 input and seven more
                    images) and NAME_b8_output.npy
  NAME_input.npy    the input (float32, standard normal, fixed seed)
  NAME_output.npy   PyTorch's float32 output for that input
  manifest.json     per model: files, input/output names and shapes, opset,
                    and how far PyTorch's float32 output is from a float64
                    run of the same model (a floor for any tolerance)

Export choices:
  - training=TrainingMode.PRESERVE: the model is in eval mode, so this
    exports inference ops, but it skips torch's ONNX eval peephole pass,
    which would otherwise fold BatchNormalization into Conv at export time
    and leave kiln no Conv-BN pair to fold itself;
  - do_constant_folding=True, fixed input shape (no dynamic axes);
  - the encoder is exported with autograd on and parameters requiring grad:
    torch 1.13's TransformerEncoderLayer takes a fused fast path
    (torch._transformer_encoder_layer_fwd, no ONNX symbolic) when grad is
    off; with grad on it runs, and exports, the standard ops (MatMul, Add,
    Softmax, ...). The exported graph is checked for non-standard domains.
"""

import argparse
import json
import os
import sys
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# PRESERVE with a model in eval mode exports inference ops; torch warns
# about training-mode constant folding regardless.
warnings.filterwarnings("ignore", message="It is recommended that constant folding be turned off")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPSET = 13


# ---- the models ----------------------------------------------------------------

def randomize_norms(model, gen):
    """Scales in [0.5, 1.5), shifts N(0, 0.1) for every BatchNorm and
    LayerNorm, so that folding them is not an identity."""
    for m in model.modules():
        if isinstance(m, (torch.nn.BatchNorm2d, torch.nn.LayerNorm)):
            with torch.no_grad():
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)


def calibrate_bn(model, gen, shape, batches=4):
    """Measure BatchNorm running statistics on random batches (cumulative
    average), as training would, then return to eval mode."""
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(shape, generator=gen))
    model.eval()


def make_cnn(name, gen):
    import torchvision
    ctor = {"resnet18": torchvision.models.resnet18, "mobilenet_v2": torchvision.models.mobilenet_v2}[name]
    model = ctor(weights=None)          # torchvision's own random init, seeded
    randomize_norms(model, gen)
    calibrate_bn(model, gen, (8, 3, 224, 224))
    return model, (1, 3, 224, 224)


def make_encoder(gen):
    layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024,
                                             batch_first=True)
    randomize_norms(layer, gen)
    return layer.eval(), (1, 128, 256)


MODELS = ["resnet18", "mobilenet_v2", "encoder"]


def make(name):
    torch.manual_seed(1234 + MODELS.index(name))    # torchvision's init draws from the global generator
    gen = torch.Generator().manual_seed(4321 + MODELS.index(name))
    model, shape = make_encoder(gen) if name == "encoder" else make_cnn(name, gen)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(99 + MODELS.index(name)))
    return model, x


# ---- export -----------------------------------------------------------------------

def export(model, x, path, opset):
    """torch.onnx.export with grad on (see the top of the file)."""
    for p in model.parameters():
        p.requires_grad_(True)
    with torch.enable_grad():
        torch.onnx.export(model, (x,), path, opset_version=opset, input_names=["input"],
                          output_names=["output"], do_constant_folding=True,
                          training=torch.onnx.TrainingMode.PRESERVE)


def graph_ops(path):
    """{(domain, op_type): node count}, read back from the ONNX file
    (models/onnx_proto.py: Debian's onnx.proto, no onnx package)."""
    import onnx_proto
    counts = {}
    for n in onnx_proto.load_model(path).graph.node:
        counts[(n.domain, n.op_type)] = counts.get((n.domain, n.op_type), 0) + 1
    return counts


def reference(model, x):
    """PyTorch's float32 output, and its worst deviation from float64."""
    with torch.no_grad():
        y = model(x)
        y64 = model.double()(x.double())
        model.float()
    err = (y.double() - y64).abs()
    return y.numpy(), {"max_abs_vs_f64": float(err.max()),
                       "max_rel_vs_f64": float((err / y64.abs().clamp_min(1e-30)).max()),
                       "max_abs_output": float(y64.abs().max())}


def export_one(name, outdir, op17, batch8):
    model, x1 = make(name)
    entries = []
    variants = [(name, OPSET, 1)] + ([(name + "_op17", 17, 1)] if op17 and name == "encoder" else [])
    variants += [(name + "_b8", OPSET, 8)] if batch8 else []
    refs = {}
    for stem, opset, batch in variants:
        if batch not in refs:
            # batch 8: the batch-1 input and seven more images drawn after it
            x = x1 if batch == 1 else torch.cat(
                [x1, torch.randn((batch - 1,) + tuple(x1.shape[1:]),
                                 generator=torch.Generator().manual_seed(77 + MODELS.index(name)))])
            stem_b = name if batch == 1 else name + "_b%d" % batch
            y, err = reference(model, x)
            np.save(os.path.join(outdir, stem_b + "_input.npy"), x.numpy())
            np.save(os.path.join(outdir, stem_b + "_output.npy"), y)
            refs[batch] = (x, y, err, stem_b)
        x, y, err, stem_b = refs[batch]
        path = os.path.join(outdir, stem + ".onnx")
        export(model, x, path, opset)
        ops = graph_ops(path)
        odd = [d for d, _ in ops if d not in ("", "ai.onnx")]
        if odd:
            sys.exit("export.py: %s uses non-standard op domains %s" % (path, sorted(set(odd))))
        entries.append({"model": stem, "onnx": stem + ".onnx", "opset": opset,
                        "batch": batch,
                        "inputs": {"input": {"file": stem_b + "_input.npy", "shape": list(x.shape)}},
                        "outputs": {"output": {"file": stem_b + "_output.npy", "shape": list(y.shape)}},
                        "ops": {t: c for (_, t), c in sorted(ops.items())}, "torch": err,
                        "bytes": os.path.getsize(path)})
        print("export.py: %-18s opset %d  %5.1f MB  %d op types  torch f32 vs f64 max abs %.2e"
              % (stem, opset, entries[-1]["bytes"] / 1e6, len(entries[-1]["ops"]), err["max_abs_vs_f64"]),
              file=sys.stderr)
    return entries


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", nargs="?", default=os.path.join(ROOT, "build", "models"))
    ap.add_argument("--only", help="comma-separated: " + ",".join(MODELS))
    ap.add_argument("--no-op17", action="store_true", help="skip the opset-17 encoder")
    ap.add_argument("--no-batch8", action="store_true", help="skip the batch-8 exports")
    a = ap.parse_args()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    os.makedirs(a.outdir, exist_ok=True)
    names = a.only.split(",") if a.only else MODELS
    for n in names:
        if n not in MODELS:
            sys.exit("export.py: unknown model %r (have %s)" % (n, ", ".join(MODELS)))
    manifest = {"torch": torch.__version__, "tolerance": {"rtol": 1e-3, "atol": 1e-4}, "models": []}
    for n in names:
        manifest["models"] += export_one(n, a.outdir, not a.no_op17, not a.no_batch8)
    with open(os.path.join(a.outdir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print("export.py: wrote %s" % os.path.join(a.outdir, "manifest.json"), file=sys.stderr)


if __name__ == "__main__":
    main()
