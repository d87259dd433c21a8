#!/bin/sh
# Encode the text-format protobufs here into the binary files the tests use
# (committed, so the tests need no protoc): mlp/ is an ONNX backend test
# (model.onnx, test_data_set_0/input_0.pb, output_K.pb) whose expected
# outputs come from oracle.py; the others are the bad inputs of
# tests/errors.sh (an op kiln lacks, a run-time shape, ...).
# Needs protoc (Debian: protobuf-compiler) and onnx.proto (libonnx-dev).
# usage: sh tests/onnx/gen.sh
set -e
cd "$(dirname "$0")"
python3 oracle.py
enc() { grep -v '^#' "$1.textproto" | protoc --encode="$2" -I/usr/include/onnx onnx.proto > "$1.$3"; }
enc mlp/model onnx.ModelProto onnx
for m in unsupported unsupported_many runtime_shape int_input symbolic opset22 nll rnn_long scatter_runtime gathernd nonzero_runtime quant_block slash_output output_clash loop_runtime loop_gather_range seq_output index_range dft_bool scan_missing; do enc $m onnx.ModelProto onnx; done
enc big_int onnx.TensorProto pb
enc string onnx.TensorProto pb
enc x23 onnx.TensorProto pb
enc loop_gather_f5 onnx.TensorProto pb
enc nll_target_bad onnx.TensorProto pb
enc gathernd_bad onnx.TensorProto pb
for m in ext_absolute ext_dotdot ext_link ext_range ext_missing; do enc ext/$m onnx.ModelProto onnx; done
for f in mlp/test_data_set_0/*.textproto; do enc "${f%.textproto}" onnx.TensorProto pb; done
# tests/onnx/ops: what opsets 18 to 21 changed, expected outputs from NumPy
/usr/bin/python3 ops/gen.py
for d in ops/*/; do
    enc "${d}model" onnx.ModelProto onnx
    for f in "$d"test_data_set_0/*.textproto; do enc "${f%.textproto}" onnx.TensorProto pb; done
done
