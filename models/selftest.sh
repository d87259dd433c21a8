#!/bin/sh
# models/selftest.sh -- prove that models/check.sh can pass and can fail,
# and spot-check the inventory's verdicts.
#
#   models/selftest.sh [MODEL_DIR]     (default build/models; exported if absent)
#
# kiln cannot load ONNX on every branch, so a stand-in plays kiln: ONNX
# Runtime (PyPI's onnxruntime in build/real/venv, which models/real.py,
# bench/models.py and bench/compare share; made here when missing) answers
# `run` through bench/ort_run.py, and `explain` prints one fold line per BatchNormalization
# node of the model (read from the file with models/onnx_proto.py) and one
# epilogue line. Then:
#   1. the stand-in as is: check.sh must pass (exit 0);
#   2. outputs perturbed by 3e-4 + 3e-3 |y|: check.sh must fail on every
#      model's output;
#   3. one fold line fewer: check.sh must fail on the Conv-BN count;
#   4. a "kiln" that cannot import ONNX: check.sh must fail loudly;
#   5. known verdicts in models/onnx_in_scope*.txt and docs/onnx-inventory.md.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
DIR=${1:-$ROOT/build/models}
PY=${PYTHON:-/usr/bin/python3}
ORT_PY=$("$PY" -c 'import sys; sys.path.insert(0, sys.argv[1]); import real; print(real.ensure_venv(sys.argv[2]))' \
    "$HERE" "$ROOT/build/real") || {
    echo "selftest.sh: needs onnxruntime from PyPI in build/real/venv (making it failed; see above)"; exit 2; }
[ -f "$DIR/manifest.json" ] || "$PY" "$HERE/export.py" "$DIR" || exit 2
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kiln-selftest-XXXXXX") || exit 2
trap 'rm -rf "$TMP"' EXIT

cat > "$TMP/fake-kiln" <<EOF
#!/bin/sh
# stand-in for kiln: ONNX Runtime runs, explain lines from the model file
cmd=\$1 model=\$2; shift 2
case \$cmd in
run)
    while [ \$# -gt 0 ]; do
        case \$1 in -i) bind=\$2; shift ;; -o) out=\$2; shift ;; esac; shift
    done
    ORT_PREALLOC=0 "$ORT_PY" "$ROOT/bench/ort_run.py" "\$model" 1 1 "\$out" "\$bind" > /dev/null || exit 1
    if [ -n "\${PERTURB:-}" ]; then
        "$PY" -c "import numpy as np, sys; y = np.load(sys.argv[1]); np.save(sys.argv[1], (y + 3e-4 + 3e-3 * np.abs(y)).astype(np.float32))" "\$out/output.npy"
    fi ;;
explain)
    "$PY" - "\$model" <<'PY'
import os, sys
sys.path.insert(0, "$HERE")
import onnx_proto
g = onnx_proto.load_model(sys.argv[1]).graph
bns = sum(n.op_type == "BatchNormalization" for n in g.node) - int(os.environ.get("FEWER", "0"))
conv = any(n.op_type == "Conv" for n in g.node)
for i in range(max(bns, 0)):
    print("  folded batch_norm into conv2d %%%d: weight w -> w_folded" % i)
print("fusing op0 with op1 (epilogue of extern_kernels.%s)" % ("conv2d" if conv else "mm"))
PY
    ;;
*) exit 2 ;;
esac
EOF
chmod +x "$TMP/fake-kiln"
printf '#!/bin/sh\necho "$2:1:1: error: unexpected character" >&2\nexit 1\n' > "$TMP/no-onnx-kiln"
chmod +x "$TMP/no-onnx-kiln"

pass=0 failed=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; failed=$((failed + 1)); }
models=$(grep -c '"model"' "$DIR/manifest.json")

"$HERE/check.sh" "$TMP/fake-kiln" "$DIR" > "$TMP/1" 2>&1 && ok "check.sh passes with ORT as kiln" ||
    { bad "check.sh fails with ORT as kiln"; cat "$TMP/1"; }
PERTURB=1 "$HERE/check.sh" "$TMP/fake-kiln" "$DIR" > "$TMP/2" 2>&1
rc=$?
n=$(grep -c "output differs from PyTorch" "$TMP/2")
[ "$rc" -eq 1 ] && [ "$n" -eq "$models" ] && ok "check.sh fails on perturbed outputs ($n of $models models)" ||
    { bad "perturbed outputs: $n of $models caught"; cat "$TMP/2"; }
FEWER=1 "$HERE/check.sh" "$TMP/fake-kiln" "$DIR" > "$TMP/3" 2>&1
[ $? -eq 1 ] && grep -q "FAIL resnet18: kiln explain: 19 lines 'folded batch_norm" "$TMP/3" &&
    ! grep -q "FAIL encoder:" "$TMP/3" && ok "check.sh fails on a missing Conv-BN fold" ||
    { bad "missing fold not caught"; cat "$TMP/3"; }
"$HERE/check.sh" "$TMP/no-onnx-kiln" "$DIR" > "$TMP/4" 2>&1
[ $? -eq 1 ] && [ "$(grep -c 'kiln cannot import or run' "$TMP/4")" -eq "$models" ] &&
    ok "check.sh fails loudly when kiln cannot import" || { bad "no-import kiln not caught"; cat "$TMP/4"; }

# inventory: verdicts checked by hand against the test models
want_in="node/test_abs node/test_conv_with_autopad_same node/test_argmax_default_axis_example
pytorch-converted/test_Conv2d pytorch-operator/test_operator_conv node/test_softmax_axis_0"
want_const="node/test_gather_0 node/test_reshape_reordered_all_dims simple/test_expand_shape_model1"
for t in $want_in; do grep -qx "$t" "$HERE/onnx_in_scope.txt" && ok "in scope: $t" || bad "not in scope: $t"; done
for t in $want_const; do grep -qx "$t" "$HERE/onnx_in_scope_const.txt" && ok "const indices: $t" ||
    bad "not in the const list: $t"; done
for t in node/test_add_uint8 node/test_where_example node/test_acos node/test_dropout_default_mask; do
    grep -qx "$t" "$HERE/onnx_in_scope.txt" "$HERE/onnx_in_scope_const.txt" && bad "in scope: $t" ||
        ok "out of scope: $t"
done
grep -q "^| $(echo node/test_add_uint8) | 14 | Add | .* | OUT: input x is UINT8" "$ROOT/docs/onnx-inventory.md" &&
    ok "inventory row with opset, ops and the reason" || bad "inventory row for node/test_add_uint8"

echo "selftest.sh: $pass passed, $failed failed"
[ "$failed" -eq 0 ]
