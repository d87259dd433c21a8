"""models/onnx_proto.py -- read ONNX files without the onnx Python package.

Debian ships onnx.proto (libonnx-dev, /usr/include/onnx/onnx.proto) but
no Python onnx module. This compiles onnx.proto with protoc --python_out
into a temporary directory once per process and imports the generated
onnx_pb2 with Debian's python3-protobuf. Needs the Debian packages
protobuf-compiler and python3-protobuf (no pip).

  import onnx_proto
  m = onnx_proto.load_model("model.onnx")     # an onnx.ModelProto
  onnx_proto.pb().TensorProto.FLOAT           # enums and messages
  onnx_proto.attr_value(attribute_proto)      # a plain Python value
"""

import importlib
import os
import shutil
import subprocess
import sys
import tempfile

PROTO = "/usr/include/onnx/onnx.proto"
_pb2 = None


def pb():
    """The generated onnx_pb2 module (compiled on first use)."""
    global _pb2
    if _pb2 is not None:
        return _pb2
    if not os.path.exists(PROTO):
        sys.exit("onnx_proto: %s not found (apt-get install libonnx-dev)" % PROTO)
    if shutil.which("protoc") is None:
        sys.exit("onnx_proto: protoc not found (apt-get install protobuf-compiler python3-protobuf)")
    try:
        import google.protobuf  # noqa: F401
    except ImportError:
        sys.exit("onnx_proto: Python protobuf not found (apt-get install python3-protobuf; "
                 "run with /usr/bin/python3)")
    tmp = tempfile.mkdtemp(prefix="kiln-onnx-proto-")
    r = subprocess.run(["protoc", "-I" + os.path.dirname(PROTO), "--python_out=" + tmp, PROTO],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode:
        sys.exit("onnx_proto: protoc failed: " + r.stdout.strip())
    sys.path.insert(0, tmp)
    try:
        _pb2 = importlib.import_module("onnx_pb2")
    finally:
        sys.path.remove(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
    return _pb2


def load_model(path):
    m = pb().ModelProto()
    with open(path, "rb") as f:
        m.ParseFromString(f.read())
    return m


def load_tensor(path):
    t = pb().TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return t


def dtype_name(elem_type):
    """TensorProto element type number -> 'FLOAT', 'INT64', ..."""
    return pb().TensorProto.DataType.Name(elem_type)


def attr_value(a):
    """An AttributeProto as a plain value: int, float, str, list, or a
    short description for tensors and graphs."""
    A = pb().AttributeProto
    if a.type == A.INT:
        return a.i
    if a.type == A.FLOAT:
        return round(a.f, 6)
    if a.type == A.STRING:
        return a.s.decode("utf-8", "replace")
    if a.type == A.INTS:
        return list(a.ints)
    if a.type == A.FLOATS:
        return [round(x, 6) for x in a.floats]
    if a.type == A.STRINGS:
        return [s.decode("utf-8", "replace") for s in a.strings]
    if a.type == A.TENSOR:
        return "tensor %s%s" % (dtype_name(a.t.data_type), list(a.t.dims))
    if a.type == A.GRAPH:
        return "graph"
    return A.AttributeType.Name(a.type).lower()
