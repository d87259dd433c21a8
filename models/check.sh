#!/bin/sh
# models/check.sh -- run kiln on the real ONNX models and compare with PyTorch.
#
#   models/check.sh KILN_BINARY [MODEL_DIR]
#
# MODEL_DIR (default build/models of this checkout) holds what models/export.py writes; if
# it has no manifest.json, the models are exported first (about 30 s).
# For each model of the manifest (resnet18, mobilenet_v2, encoder at opset
# 13, encoder_op17 at opset 17):
#   1. kiln run MODEL.onnx -i input=NAME_input.npy -o DIR --threads N, then
#      models/compare.py: every element within rtol 1e-3, atol 1e-4 of
#      PyTorch's float32 output (|kiln - torch| <= atol + rtol |torch|; why
#      those numbers: models/compare.py); prints max abs and rel error;
#   2. kiln explain MODEL.onnx, grepped for
#      - "folded batch_norm into conv2d": one per BatchNormalization node of
#        the ONNX graph (every BN in these CNNs follows a Conv);
#      - "(epilogue of extern_kernels.conv2d)" (models with Conv) or
#        "(epilogue of extern_kernels.mm/bmm)" (models with MatMul or Gemm
#        only): at least one pointwise consumer (BN-folded bias + ReLU, the
#        residual add, Clip) fused into the library call.
# Any failure -- including kiln not being able to import ONNX at all --
# prints FAIL with kiln's message; the script exits 1 if any check failed.
# Environment: PYTHON (default /usr/bin/python3), KILN_THREADS (default 2),
# KILN_CACHE_DIR (passed through to kiln).
set -u

die() { echo "check.sh: $*" >&2; exit 2; }

[ $# -ge 1 ] || die "usage: models/check.sh KILN_BINARY [MODEL_DIR]"
KILN=$1
DIR=${2:-$(dirname "$0")/../build/models}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-/usr/bin/python3}
THREADS=${KILN_THREADS:-2}
[ -x "$KILN" ] || die "$KILN is not an executable kiln binary"
if [ ! -f "$DIR/manifest.json" ]; then
    echo "check.sh: no $DIR/manifest.json: exporting the models" >&2
    "$PY" "$HERE/export.py" "$DIR" || die "models/export.py failed"
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kiln-models-XXXXXX") || die "mktemp failed"
trap 'rm -rf "$TMP"' EXIT

# one line per model: name onnx input.npy output.npy batchnorms has_conv
"$PY" - "$DIR/manifest.json" > "$TMP/list" <<'EOF' || die "cannot read the manifest"
import json, sys
for e in json.load(open(sys.argv[1]))["models"]:
    ops = e["ops"]
    print(e["model"], e["onnx"], e["inputs"]["input"]["file"], e["outputs"]["output"]["file"],
          ops.get("BatchNormalization", 0), int("Conv" in ops))
EOF

fails=0
total=0
# the last lines of kiln's stderr, printable characters only (a parser
# error quotes the binary file)
msg() { tail -n 3 "$1" | tr '\n' ' ' | tr -cd '[:print:]' | cut -c 1-300; }
fail() { echo "FAIL $name: $*"; fails=$((fails + 1)); }

# expect NAME LABEL ERE MIN MAX: count the lines of the explain text that
# match the extended regular expression ERE
expect() {
    n=$(grep -cE "$3" "$TMP/$1.explain")
    if [ "$n" -lt "$4" ] || [ "$n" -gt "$5" ]; then
        fail "kiln explain: $n lines '$3' ($2), want $4..$5"
    else
        echo "ok   $1: kiln explain: $n x '$3' ($2)"
    fi
}

check_model() {
    name=$1 onnx=$DIR/$2 input=$DIR/$3 want=$DIR/$4 bns=$5 conv=$6
    out=$TMP/$name
    mkdir -p "$out"
    if ! "$KILN" run "$onnx" -i "input=$input" -o "$out" --threads "$THREADS" \
            > "$TMP/$name.run" 2>&1; then
        fail "kiln cannot import or run $2: $(msg "$TMP/$name.run")"
        return
    fi
    if ! r=$("$PY" "$HERE/compare.py" "$out/output.npy" "$want" 2>&1); then
        fail "output differs from PyTorch's: $r"
    else
        echo "ok   $name: $r"
    fi
    if ! "$KILN" explain "$onnx" > "$TMP/$name.explain" 2>&1; then
        fail "kiln explain failed: $(msg "$TMP/$name.explain")"
        return
    fi
    expect "$name" "Conv-BN folding" "folded batch_norm into conv2d" "$bns" "$bns"
    if [ "$conv" = 1 ]; then
        expect "$name" "conv epilogues" "\(epilogue of extern_kernels\.conv2d\)" 1 100000
    else
        expect "$name" "matmul epilogues" "\(epilogue of extern_kernels\.b?mm\)" 1 100000
    fi
}

while read -r name onnx input want bns conv; do
    total=$((total + 1))
    check_model "$name" "$onnx" "$input" "$want" "$bns" "$conv"
done < "$TMP/list"

if [ "$fails" -gt 0 ]; then
    echo "check.sh: $fails check(s) FAILED over $total models ($KILN, $DIR)"
    exit 1
fi
echo "check.sh: all $total models match PyTorch and show Conv-BN folding and epilogues"
