#!/bin/sh
# Install the Debian packages kiln needs to build and test, if missing.
# As root it runs apt-get; otherwise it prints the exact command and fails.
# Arguments name extra packages a target needs (valgrind, clang).
# libdnnl-dev: oneDNN, conv2d. protobuf-c: the ONNX importer (protoc-c
# generates its reader from the onnx.proto of libonnx-dev); libonnx-testdata:
# the ONNX conformance tests.
PKGS="gcc make libc6-dev libgomp1 libopenblas-openmp-dev libdnnl-dev protobuf-c-compiler libprotobuf-c-dev libonnx-dev libonnx-testdata $*"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ]; then
    echo "deps: installing$missing"
    (apt-get install -y $missing || { apt-get update && apt-get install -y $missing; }) >/dev/null || {
        echo "deps: apt-get install -y$missing failed" >&2; exit 1; }
else
    echo "deps: missing Debian packages; run: sudo apt-get install -y$missing" >&2
    exit 1
fi
