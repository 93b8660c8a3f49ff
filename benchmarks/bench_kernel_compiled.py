"""Benchmark without a GPU: what the GPU tile kernel costs once compiled, per thread, for an NVIDIA architecture.

Triton compiles :func:`attnviz.core.triton_kernel.attend_rows_kernel` down to the GPU's machine code (SASS) with the
``ptxas`` its wheel ships, on any machine: no GPU and no driver are needed. For each input dtype, head size and set of
statistics this prints, for the launch the kernel would use (``--all-launches``: every launch ``bench_stats_gpu.py
--tune`` tries):

* ``registers`` per thread (255 is the ceiling; above ~168 fewer programs share an SM), and ``spilled`` bytes per
  thread that did not fit in registers and go through local memory (slow: the target is 0);
* ``loop``: the instructions of the loop over interior key tiles (those every query of the block may weigh: a long
  causal pass spends nearly all its time there), with its ``exp2`` and tensor-core instructions.

``--against REV`` compiles the kernel of another git revision beside the working tree's, side by side. These counts
say how much work a tile takes, not how long: timings need a GPU (``bench_stats_gpu.py``).

    python benchmarks/bench_kernel_compiled.py
    python benchmarks/bench_kernel_compiled.py --against HEAD~1 --arch 90 --all-launches
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # as the launch asks (enable_fp_fusion=True)
# compiled, not run by the interpreter: Triton reads this as it is imported (its own functions are decorated then)
os.environ["TRITON_INTERPRET"] = "0"

#: statistic sets: (band reach, chosen key columns, the carriers' weighted sums)
STATISTICS = {"output": None, "summary": (1, 2, False), "summary+carriers": (1, 2, True)}
#: the kernel's other variants (``--variants``): how its keys are hidden, and attention sinks
VARIANTS = {
    "additive mask": {"HAS_MASK": True},
    "mask, not causal": {"HAS_MASK": True, "CAUSAL": False},
    "padding": {"PADDED": True},
    "sliding window": {"WINDOWED": True},
    "sinks": {"SINKS": True, "SHARE": True},
    "sinks, window, mask": {"SINKS": True, "SHARE": True, "WINDOWED": True, "HAS_MASK": True},
    "head not filling its block": {"EVEN_D": False},
    "encoder: padding, two-sided window": {"CAUSAL": False, "PADDED": True, "WINDOWED": True},
}
#: strides that are 1 when attnviz launches the kernel (the innermost axis of each tensor): Triton's JIT makes an
#: integer argument equal to 1 a constant, so the compiled kernel knows them
UNIT_STRIDES = ("sqd", "skd", "svd", "smn", "sod", "ssm", "swn", "sxm", "szm")
POINTER_TYPES = {"Columns": "i32", "KeyStart": "i64", "KeyStop": "i64"}  # the rest: the input dtype or float32
INPUT_POINTERS = ("Q", "K", "V", "Out")
TRITON_TYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


@dataclasses.dataclass(frozen=True)
class Compiled:
    """Per-thread resources of one compiled kernel and the instructions of its interior key-tile loop."""

    registers: int
    spilled: int  # bytes per thread of local memory (stack) for values that did not fit in registers
    loop_instructions: int
    loop_exp2: int
    loop_tensor_core: int


def _tools() -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def load_kernel(revision: str | None):
    """The kernel of the working tree, or of a git ``revision``: its file loaded as a module of its own."""
    root = Path(__file__).resolve().parent.parent
    if revision is None:
        text = (root / "attnviz" / "core" / "triton_kernel.py").read_text()
    else:
        shown = subprocess.run(
            ["git", "show", f"{revision}:attnviz/core/triton_kernel.py"],
            cwd=root,
            capture_output=True,
            text=True,
            check=False,
        )
        if shown.returncode:
            raise SystemExit(f"error: git show {revision}: {shown.stderr.strip()}")
        text = shown.stdout
    stem = "compiled_triton_kernel_" + re.sub(r"\W", "_", revision or "tree")
    path = Path(tempfile.mkdtemp()) / f"{stem}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[stem] = module  # Triton reads the kernel's source through its module
    spec.loader.exec_module(module)
    return module.attend_rows_kernel


def compile_kernel(
    kernel,
    dtype: str,
    head_dim: int,
    statistics: tuple[int, int, bool] | None,
    launch: tuple[int, int, int, int],
    arch: int = 90,
    **variant: object,
) -> Compiled:
    """Compile ``kernel`` for a causal pass (no mask tensor) of ``dtype`` heads of ``head_dim`` with ``statistics``
    (see :data:`STATISTICS`) and ``launch`` ``(block_m, block_n, num_warps, num_stages)`` for ``sm_<arch>``;
    ``variant``: other values of the kernel's constants (``HAS_MASK=True``, ``CAUSAL=False``, ``SINKS=True``…)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    reach, columns, weights = statistics or (0, 0, False)
    block_m, block_n, warps, stages = launch
    block = 1 << (head_dim - 1).bit_length()  # the head's block: a power of two, as the launch rounds it
    constants: dict[str, object] = {
        "HAS_MASK": False, "CAUSAL": True, "WINDOWED": False, "PADDED": False, "SUMMARY": statistics is not None,
        "REACH": reach, "BAND_P2": 1 << (2 * reach).bit_length(), "COLUMNS": columns,
        "COLUMNS_P2": max(1, 1 << max(0, columns - 1).bit_length()), "WEIGHTS": weights, "BLOCK_M": block_m,
        "BLOCK_N": block_n, "BLOCK_D": block, "BLOCK_DV": block, "UPCAST": False, "SINKS": False,
        "SHARE": False, "PRECISION": "ieee" if dtype == "float32" else "tf32",
    }  # fmt: skip
    if "EVEN_D" in kernel.arg_names:  # an older kernel may not have it
        constants["EVEN_D"] = block == head_dim
    constants |= variant  # e.g. HAS_MASK=True, PADDED=True, WINDOWED=True, SINKS=True, SHARE=True
    constants |= dict.fromkeys(UNIT_STRIDES, 1)
    signature, attributes = {}, {}
    for index, name in enumerate(kernel.arg_names):
        if name in constants:
            signature[name] = "constexpr"
        elif name[0].isupper():  # a tensor
            element = TRITON_TYPES[dtype] if name in INPUT_POINTERS else POINTER_TYPES.get(name, "fp32")
            signature[name] = f"*{element}"
            attributes[(index,)] = [["tt.divisibility", 16]]  # torch's allocations are 16-byte aligned
        else:
            signature[name] = "fp32" if name == "scaling" else "i32"
            # the lengths are; the head sizes and the other strides (products of them) where the head's size is
            head_sized = name in ("head_dim", "value_dim") or name[0] == "s"
            if name in ("q_len", "k_len") or (head_sized and head_dim % 16 == 0):
                attributes[(index,)] = [["tt.divisibility", 16]]
    source = ASTSource(kernel, signature, constants, attributes)
    options = {"num_warps": warps, "num_stages": stages}
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        usage = subprocess.run(
            [_tools() / "cuobjdump", "--dump-resource-usage", cubin.name], capture_output=True, text=True, check=True
        ).stdout
        sass = subprocess.run([_tools() / "nvdisasm", "-c", cubin.name], capture_output=True, text=True, check=True)
    found = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    if found is None:
        raise RuntimeError(f"cuobjdump gave no resource usage: {usage[:200]}")
    loop = _innermost_loop(sass.stdout)
    return Compiled(
        registers=int(found[1]),
        spilled=int(found[2]),
        loop_instructions=len(loop),
        loop_exp2=sum(op.startswith("MUFU.EX2") for op in loop),
        loop_tensor_core=sum(op.startswith(("HGMMA", "HMMA")) for op in loop),
    )


def _innermost_loop(sass: str) -> list[str]:
    """The opcodes of the shortest loop in ``sass`` (nvdisasm's text: a backward branch to a label closes a loop):
    the interior key tiles', which need no mask and so the fewest instructions."""
    labels: dict[str, int] = {}
    instructions: list[tuple[int, str, str]] = []  # (address, opcode, operands)
    pending: list[str] = []
    for line in sass.splitlines():
        label = re.match(r"\s*\.(L_x_\d+):", line)
        if label:
            pending.append(label[1])
            continue
        found = re.match(r"\s*/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)(.*)", line)
        if found:
            address = int(found[1], 16)
            labels |= dict.fromkeys(pending, address)
            pending = []
            instructions.append((address, found[2], found[3]))
    loops = []
    for address, opcode, operands in instructions:
        target = re.search(r"`\(\.(L_x_\d+)\)", operands) if opcode.startswith("BRA") else None
        if target and labels.get(target[1], address + 1) < address:
            start = labels[target[1]]
            loops.append([op for at, op, _ in instructions if start <= at <= address])
    return min(loops, key=len) if loops else []


def programs_per_sm(registers: int, warps: int) -> int:
    """How many programs of ``warps`` warps fit in an SM's 65,536 registers (allocated per warp in units of 256)."""
    per_warp = -(-registers * 32 // 256) * 256
    return 65536 // (per_warp * warps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="also compile the kernel of this git revision, side by side")
    parser.add_argument("--arch", type=int, default=90, help="compute capability ×10: 90 Hopper, 80 Ampere")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument(
        "--all-launches",
        action="store_true",
        help="every launch a GPU times on first use (attnviz.core.triton_launch.CANDIDATE_LAUNCHES)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per kernel compiled, for scripts")
    parser.add_argument("--variants", action="store_true", help="also every statistic with masks, windows, sinks…")
    parser.add_argument(
        "--float32-products",
        choices=("auto", "ieee", "tf32x3"),
        default="auto",
        help="how float32 inputs are multiplied (LaunchConfig.float32_products; auto: as a launch would by default)",
    )
    options = parser.parse_args()
    unknown = [dtype for dtype in options.dtypes.split(",") if dtype not in TRITON_TYPES]
    if unknown:
        parser.error(f"--dtypes: {', '.join(unknown)}: choose among {', '.join(TRITON_TYPES)}")
    if not all(size.isdigit() and int(size) >= 16 for size in options.head_dims.split(",")):
        parser.error(f"--head-dims: {options.head_dims}: whole numbers of at least 16, comma-separated")

    import torch

    from attnviz.core.triton_launch import CANDIDATE_LAUNCHES
    from attnviz.core.triton_rows import float32_precision, launch_config

    kernels = {"this tree": load_kernel(None)}
    if options.against:
        kernels[options.against] = load_kernel(options.against)
    if not options.json:
        print(f"sm_{options.arch}; per thread: registers, spilled bytes, programs per SM; interior loop: instructions")
        if "float32" in options.dtypes.split(","):
            print(f"float32 products: {float32_precision(options.float32_products)}")
    for dtype in options.dtypes.split(","):
        for head_dim in map(int, options.head_dims.split(",")):
            chosen = launch_config(getattr(torch, dtype), head_dim)
            launches = [(chosen.block_m, chosen.block_n, chosen.num_warps, chosen.num_stages)]
            candidates = [(c.block_m, c.block_n, c.num_warps, c.num_stages) for c in CANDIDATE_LAUNCHES]
            launches += [launch for launch in candidates if options.all_launches and launch not in launches]
            for launch in launches:
                builds = [(name, statistics, {}) for name, statistics in STATISTICS.items()]
                if options.variants:
                    full = STATISTICS["summary+carriers"]
                    builds += [(f"every one, {name}", full, variant) for name, variant in VARIANTS.items()]
                for statistics_name, statistics, variant in builds:
                    if dtype == "float32":
                        variant = {"PRECISION": float32_precision(options.float32_products)} | variant
                    cells = []
                    for kernel_name, kernel in kernels.items():
                        try:
                            c = compile_kernel(kernel, dtype, head_dim, statistics, launch, options.arch, **variant)
                        except Exception as error:  # noqa: BLE001  # a launch the architecture cannot hold
                            cells.append(f"{kernel_name}: {type(error).__name__}")
                            found = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
                        else:
                            found = dataclasses.asdict(c)
                        if options.json:
                            where = {"kernel": kernel_name, "dtype": dtype, "head_dim": head_dim, "launch": launch}
                            print(json.dumps(where | {"statistics": statistics_name} | found), flush=True)
                        if "error" in found:
                            continue
                        cells.append(
                            f"{kernel_name}: {c.registers} reg, {c.spilled} B spilled, "
                            f"{programs_per_sm(c.registers, launch[2])}/SM, loop {c.loop_instructions} "
                            f"({c.loop_exp2} exp2, {c.loop_tensor_core} MMA)"
                        )
                    if options.json:
                        continue
                    shape = f"{dtype} d{head_dim} {launch[0]}x{launch[1]} w{launch[2]} s{launch[3]}"
                    print(f"{shape:<28} {statistics_name:<17} " + "  |  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
