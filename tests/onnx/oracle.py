#!/usr/bin/python3
# The expected outputs of mlp/model.onnx on its input, computed here with
# plain Python (an oracle independent of kiln), written as TensorProto
# text for gen.sh to encode: mlp/test_data_set_0/output_0 (p), output_1 (cls).
import math, os, re

here = os.path.dirname(os.path.abspath(__file__))

def floats(text, name):
    m = re.search(r'name: "%s".*?float_data: \[([^\]]*)\]' % name, text, re.S)
    return [float(v) for v in m.group(1).split(',')]

model = open(os.path.join(here, 'mlp/model.textproto')).read()
w1, b1 = floats(model, 'w1'), floats(model, 'b1')
xs = open(os.path.join(here, 'mlp/test_data_set_0/input_0.textproto')).read()
x = [float(v) for v in re.search(r'float_data: \[([^\]]*)\]', xs).group(1).split(',')]
p, cls = [], []
for n in range(2):
    h = [max(0.0, sum(x[n * 4 + k] * w1[j * 4 + k] for k in range(4)) + b1[j]) for j in range(3)]
    e = [math.exp(v - max(h)) for v in h]
    p += [v / sum(e) for v in e]
    cls.append(max(range(3), key=lambda j: h[j]))
out = os.path.join(here, 'mlp/test_data_set_0')
with open(os.path.join(out, 'output_0.textproto'), 'w') as f:
    f.write('# output p of mlp/model.onnx, from oracle.py\ndims: 2 dims: 3 data_type: 1 name: "p"\n')
    f.write('float_data: [%s]\n' % ', '.join(repr(v) for v in p))
with open(os.path.join(out, 'output_1.textproto'), 'w') as f:
    f.write('# output cls of mlp/model.onnx, from oracle.py\ndims: 2 data_type: 7 name: "cls"\n')
    f.write('int64_data: [%s]\n' % ', '.join(str(v) for v in cls))
