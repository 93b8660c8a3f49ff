"""``attnviz samples``: copy the shipped sample files (texts, alignment pairs, toy checkpoints) into a folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnviz.cli.options import OUTPUT_PANEL


def samples(
    folder: Annotated[
        Path,
        typer.Argument(
            help="Folder to create (new or empty). Example: attnviz samples my-samples",
            rich_help_panel=OUTPUT_PANEL,
        ),
    ] = Path("sample_data"),
) -> None:
    """Copy attnviz's sample files into FOLDER (default: sample_data), to try every command on them.

    The files: the default corpus (corpus.txt), short texts (notes.txt, heldout.txt), JSON Lines (reviews.jsonl), sentence pairs with gold word alignments (pairs.jsonl, for attnviz align) and the trained toy checkpoints (toy/). The folder's path is printed on stdout; running it again on the same folder changes nothing.

    Examples:

      attnviz samples

      attnviz samples && attnviz stats --data sample_data/reviews.jsonl
    """
    from attnviz.cli.console import console
    from attnviz.outputs.samples import copy_samples, shipped_samples

    destination, copied = copy_samples(folder)
    if copied:
        names = sorted(path.name for path in shipped_samples().iterdir() if not path.name.startswith((".", "_")))
        console.print(f"copied {', '.join(names)} into {destination}", highlight=False)
    else:
        console.print(f"{destination} already holds attnviz's sample files", highlight=False)
    print(destination)


def register(app: typer.Typer) -> None:
    app.command("samples")(samples)
