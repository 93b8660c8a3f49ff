"""``attnviz capture``: save every attention pattern of a sentence for scripts and other tools."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnviz.cli.options import (
    OUTPUT_PANEL,
    DeviceMapOption,
    DeviceOption,
    DtypeOption,
    MaxLengthOption,
    ModelOption,
    NoTruncateOption,
    TargetOption,
)


def capture(
    text: Annotated[str, typer.Argument(help='The sentence to capture. Example: "The cat sat on the mat."')],
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            "-o",
            help="Output .safetensors file (format in the README). Example: --out cat.safetensors",
            rich_help_panel=OUTPUT_PANEL,
        ),
    ],
    model: ModelOption = "minilm",
    target: TargetOption = None,
    with_rollout: Annotated[
        bool,
        typer.Option(
            "--rollout",
            help="Also store the attention rollout as the float32 tensor 'rollout' [query, key] (the encoder's for "
            "encoder-decoder models). Example: --rollout",
            rich_help_panel=OUTPUT_PANEL,
        ),
    ] = False,
    max_length: MaxLengthOption = None,
    no_truncate: NoTruncateOption = False,
    device: DeviceOption = "auto",
    dtype: DtypeOption = "auto",
    device_map: DeviceMapOption = None,
) -> None:
    """Save all attention patterns of TEXT as a safetensors file (one \\[head, query, key] tensor per layer).

    Examples:

      attnviz capture "The cat sat on the mat." --out cat.safetensors

      attnviz heatmap --from-capture cat.safetensors --layer 0
    """
    from attnviz.cli.heatmap_cmd import _capture, _summary
    from attnviz.io import check_output_path

    out = check_output_path(out, (".safetensors",))
    result = _capture(
        text, target, model, max_length, no_truncate, device, dtype, device_map.value if device_map else None
    )
    if with_rollout:
        from attnviz.heads.rollout import rollout

        result.extras["rollout"] = rollout(result)
    path = result.save(out)
    _summary(result, None)
    print(path)


def register(app: typer.Typer) -> None:
    app.command("capture")(capture)
