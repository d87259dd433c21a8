#!/usr/bin/python3
"""Write the .npy fixtures that tests/test_npy.c reads, with NumPy itself.

NumPy is the independent implementation the tests compare against: kiln
must read these files, reject the unsupported ones with a clear message, and
write byte-identical files for the same arrays. The values are fixed (arange
and literals), and test_npy.c spells out the same values.

Run from anywhere: /usr/bin/python3 tests/npy/gen.py
"""
import os

import numpy as np
from numpy.lib import format as npf

HERE = os.path.dirname(os.path.abspath(__file__))


def save(name, arr, version=None):
    with open(os.path.join(HERE, name), "wb") as f:
        npf.write_array(f, arr, version=version)


# Supported: kiln must read these exactly (and write the version-1.0 ones
# byte for byte).
save("f32_2x3.npy", (np.arange(6, dtype=np.float32) * 0.5 - 1).reshape(2, 3))
save("f64_4.npy", np.array([0.1, -2.5, 1e300, -0.0], dtype=np.float64))
# what `y = x * 3.0 - 0.1` gives on it in double (tests/cli.sh: f64_npy_values;
# in float 1e300 alone would be inf)
save("f64_4_x3_minus01.npy",
     np.array([0.1, -2.5, 1e300, -0.0], dtype=np.float64) * 3.0 - 0.1)
save("i32_3x1x2.npy", np.arange(-3, 3, dtype=np.int32).reshape(3, 1, 2))
save("i64_5.npy", np.array([-2**63, -1, 0, 1, 2**63 - 1], dtype=np.int64))
save("bool_2x2.npy", np.array([[True, False], [False, True]]))
save("f32_rank0.npy", np.array(3.25, dtype=np.float32))
save("v2_f32_3.npy", np.arange(3, dtype=np.float32), version=(2, 0))
save("v3_f64_2x2.npy", np.arange(4, dtype=np.float64).reshape(2, 2) + 0.5,
     version=(3, 0))

# Unsupported: kiln must reject these with a message saying why.
save("fortran_f32_2x3.npy", np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)))
save("bigendian_f32_3.npy", np.arange(3, dtype=">f4"))
save("f16_3.npy", np.arange(3, dtype=np.float16))
save("c64_2.npy", np.array([1 + 2j, 3 - 4j], dtype=np.complex64))
save("structured_2.npy", np.zeros(2, dtype=[("a", "<i4"), ("b", "<f4")]))
# A UTF-8 field name needs format 3.0.
save("structured_utf8_v3.npy", np.zeros(1, dtype=[("\u00e9t\u00e9", "<f4")]), version=(3, 0))
save("empty_0x3.npy", np.zeros((0, 3), dtype=np.float32))
