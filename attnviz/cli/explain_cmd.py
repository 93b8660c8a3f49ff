"""``attnviz explain``: why one head attends where it does — its query and key vectors."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnviz.cli.option_groups import MODEL_DEVICE, ModelDevice, expand_option_groups
from attnviz.cli.options import (
    OUTPUT_PANEL,
    VIEW_PANEL,
    DataOption,
    choice_enum,
    choice_option,
    option,
)
from attnviz.heads.choices import PROJECTIONS

ProjectionChoice = choice_enum("ProjectionChoice", PROJECTIONS)
#: what --out may write: the page, or a figure
PAGE_SUFFIXES = (".html", ".htm")
FIGURE_SUFFIXES = (".png", ".svg", ".pdf")


@expand_option_groups
def explain(
    model: Annotated[
        str, typer.Argument(help="Model spec: minilm, smollm2, a Hugging Face directory, … Example: smollm2")
    ],
    text: Annotated[
        str,
        typer.Argument(help="The text whose weight is explained ('-' reads standard input). Example: 'The cat sat.'"),
    ],
    layer: Annotated[int, typer.Option("--layer", "-l", help="Layer (negative from the end). Example: --layer 3")],
    head: Annotated[int, typer.Option("--head", help="Head of that layer. Example: --head 2", show_default=False)],
    query: option(
        str, "--query", "-q", help="Query position: a token index or 'last'. Example: --query 5", panel=VIEW_PANEL
    ) = "last",
    key: option(
        str, "--key", "-k", help="Key position: a token index or 'last'. Example: --key 0", panel=VIEW_PANEL
    ) = "0",
    data: DataOption = None,
    projection: choice_option(
        ProjectionChoice,
        "--projection",
        "projection",
        help="How the map places queries and keys in 2-D: pca (an SVD, the same every time) or tsne "
        "(scikit-learn, placed with --seed). Example: --projection tsne",
        panel=VIEW_PANEL,
    ) = "pca",
    seed: option(
        int,
        "--seed",
        min=0,
        max=2**32 - 1,
        help="Seed of t-SNE and of the tokens drawn above --points. Example: --seed 1",
        panel=VIEW_PANEL,
    ) = 0,
    points: option(
        int, "--points", min=4, help="Most queries + keys on the map. Example: --points 1000", panel=VIEW_PANEL
    ) = 2000,
    links: option(
        int,
        "--links",
        min=0,
        help="Strongest query → key weights drawn on the map. Example: --links 100",
        panel=VIEW_PANEL,
    ) = 60,
    out: option(
        list[Path] | None,
        "--out",
        "-o",
        help="Write the breakdown and the map of the head's queries and keys over TEXT (or --data): .html "
        "(a self-contained page) or .png/.svg/.pdf (a figure); repeat for both. Example: --out why.html --out why.png",
        panel=OUTPUT_PANEL,
    ) = None,
    model_device: ModelDevice = MODEL_DEVICE,
) -> None:
    """Why a head attends: the query and key vectors behind one weight, and the head's queries and keys mapped together.

    Prints the logit of one query → key weight dimension by dimension (q_d·k_d; for rotary models, by frequency band). With --out, also maps the head's queries and keys over TEXT or a corpus (--data) in 2-D, coloured by position and by token, with the strongest weights drawn.

    Examples:

      attnviz explain minilm "The cat sat on the mat." --layer 2 --head 9 --query 3 --key 0

      attnviz explain smollm2 "The cat sat on the mat because it was tired." --layer 3 --head 2 --out why.html

      attnviz explain smollm2 "The cat sat." --layer 3 --head 2 --data notes.txt --out map.png --out map.html
    """
    from attnviz.cli.console import console
    from attnviz.cli.stdin import corpus_from_options, text_or_stdin
    from attnviz.common.errors import InputError
    from attnviz.common.progress import status
    from attnviz.heads.query_key import explain_logit, query_key_map
    from attnviz.models.specs import load_model
    from attnviz.outputs.files import check_output_path
    from attnviz.render.heatmap import save_figure
    from attnviz.render.html_page import write_page
    from attnviz.render.query_key import breakdown_table, query_key_figure, query_key_html

    outputs = [check_output_path(path, PAGE_SUFFIXES + FIGURE_SUFFIXES) for path in out or []]
    text = text_or_stdin(text)
    if text is None or not text.strip():
        raise InputError("the text is empty: give at least one word")
    corpus = corpus_from_options(data, None) if data is not None else [text]
    with status(f"loading {model}"):
        loaded = load_model(model, **model_device.loading())
    breakdown = explain_logit(loaded, text, layer=layer, head=head, query=query, key=key)
    mapping = None
    if outputs:
        with status("mapping the head's queries and keys"):
            mapping = query_key_map(
                loaded,
                corpus or [text],
                layer=layer,
                head=head,
                projection=projection.value,
                seed=seed,
                max_points=points,
                links=links,
            )
    console.print(breakdown_table(breakdown))
    for path in outputs:
        if path.suffix.lower() in PAGE_SUFFIXES:
            print(write_page(path, query_key_html(breakdown, mapping)))
        else:
            print(save_figure(query_key_figure(breakdown, mapping), path))


def register(app: typer.Typer) -> None:
    """Add this command to ``app``."""
    app.command("explain")(explain)
