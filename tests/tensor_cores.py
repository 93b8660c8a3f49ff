"""Float32 products rounded as a GPU's tensor cores round them, for kernels run by Triton's interpreter.

The interpreter multiplies ``tl.dot``'s float32 tiles in float32 whatever ``input_precision`` asks for. On a GPU a
TF32 operand keeps 10 of float32's 23 mantissa bits (``cvt.rna``: to nearest, ties away from zero), and TF32×3
splits each input into that part and the rest and adds ``big·big + (small·big + big·small)``, as Triton (3.2 and
later) lowers it. :func:`round_as_tensor_cores` makes the interpreter do the same, so that tests on the CPU see the
GPU's arithmetic.
"""

from __future__ import annotations

import numpy as np


def tf32(values: np.ndarray) -> np.ndarray:
    """``values`` rounded to TF32 (kept as float32): round half away from zero, then drop 13 mantissa bits."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def round_as_tensor_cores(monkeypatch) -> dict[str, str]:
    """Patch the interpreter's products (through ``monkeypatch``); returns ``{"TF32x3": "TF32x3", "TF32": "TF32"}``,
    the arithmetic each precision is given: a test may set ``"TF32x3"`` to ``"TF32"`` (one product)."""
    from triton.runtime import interpreter

    given = {"TF32x3": "TF32x3", "TF32": "TF32"}
    builder = interpreter.InterpreterBuilder
    plain = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        arithmetic = given.get(getattr(input_precision, "name", ""))
        if arithmetic is None or a.data.dtype != np.float32 or b.data.dtype != np.float32:
            return plain(self, a, b, d, input_precision, max_num_imprecise_acc)
        a_big, b_big = tf32(a.data), tf32(b.data)
        product = np.matmul(a_big, b_big)
        if arithmetic == "TF32x3":
            a_small, b_small = tf32(a.data - a_big), tf32(b.data - b_big)
            product += np.matmul(a_small, b_big) + np.matmul(a_big, b_small)
        return interpreter.TensorHandle(product.astype(d.data.dtype) + d.data, d.dtype.scalar)

    monkeypatch.setattr(builder, "create_dot", create_dot)
    return given
