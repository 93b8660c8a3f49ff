"""The closed sets a model is loaded with; imports nothing heavy (the command line lists them)."""

from __future__ import annotations

#: precisions a model can run in (``auto``: the checkpoint's own)
DTYPE_NAMES = ("auto", "float32", "float16", "bfloat16")
#: short spellings of the precisions
DTYPE_ALIASES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
