"""The GPU tile kernel compiled for Hopper (sm_90) on this machine, without a GPU: Triton's wheel ships ``ptxas``,
so the machine code a GPU would run can be inspected anywhere. ``benchmarks/bench_kernel_compiled.py`` compiles it
(in a process of its own: this one runs Triton's interpreter) and reports per thread what is checked here.

What is checked is what makes a tile slow whatever the GPU: values spilled out of registers into local memory, and
work in the loop over interior key tiles (where a long causal pass spends nearly all its time) that belongs to the
few tiles around the diagonal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="Triton is not installed (pip install triton)")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict]:
    """bfloat16 heads of 64 (SmolLM2's) in the launch attnviz picks, causal: each statistic set's compiled kernel."""
    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    command = [sys.executable, "benchmarks/bench_kernel_compiled.py", "--json", "--dtypes", "bfloat16"]
    command += ["--head-dims", "64", "--variants"]
    run = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    found = {entry["statistics"]: entry for entry in map(json.loads, run.stdout.splitlines())}
    if "error" in found["output"]:  # no ptxas for this machine, or a Triton whose compiler takes other arguments
        pytest.skip(f"this Triton cannot compile the kernel for sm_90 here: {found['output']['error']}")
    return found


def test_every_variant_compiles(compiled):
    """Masks, padding, windows, sinks, heads narrower than their block, with every statistic: the interpreter runs
    them on the CPU (test_core_triton.py), but only a compiler says that a GPU can."""
    variants = {name: entry for name, entry in compiled.items() if name.startswith("every one, ")}
    assert len(variants) == 8
    assert not [entry for entry in variants.values() if "error" in entry], variants


@pytest.mark.parametrize("statistics", ["output", "summary+carriers"])
def test_bfloat16_heads_of_64_fit_in_registers(compiled, statistics):
    """With and without every statistic (the band, two key columns, a carrier's weighted sums): nothing spilled."""
    result = compiled[statistics]
    assert result["spilled"] == 0, result
    assert result["loop_tensor_core"] > 0 and result["loop_exp2"] > 0, result  # the loop found is the tiles' loop


def test_the_band_stays_out_of_the_interior_tiles(compiled):
    """The interior loop with every statistic against the one without: the sums add per key what the softmax itself
    takes (about 2.4x the instructions in all: a multiply-add and a sum per statistic, the columns' rare branches);
    the band's code, which only the tiles around the diagonal need, would make it 3.7x."""
    plain, full = compiled["output"], compiled["summary+carriers"]
    assert full["loop_exp2"] == plain["loop_exp2"]  # not one exponential more per key
    assert full["loop_instructions"] <= 3.0 * plain["loop_instructions"], (full, plain)
