"""``attnviz circuit``: which heads feed which — attribution patching of nodes and edges, faithful circuits."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from attnviz.circuit.choices import METHODS, METRICS
from attnviz.cli.option_groups import (
    BATCH_OPTIONS,
    PROMPT_PAIR,
    BatchOptions,
    OptionGroup,
    PromptPair,
    expand_option_groups,
)
from attnviz.cli.options import (
    INPUT_PANEL,
    OUTPUT_PANEL,
    VIEW_PANEL,
    JsonOption,
    choice_enum,
    choice_parser,
    option,
    terminal_list_option,
)

CIRCUIT_PANEL = "Circuit"

Method = choice_enum("Method", METHODS)
Metric = choice_enum("Metric", METRICS)


def _circuit_option(option: str, help_text: str, **extra):
    return typer.Option(option, help=help_text, rich_help_panel=CIRCUIT_PANEL, **extra)


@dataclass(frozen=True)
class CircuitSearch:
    """How ``attnviz circuit`` scores the graph and chooses its circuit: the options of the same names of
    :func:`attnviz.circuit.find_circuit`."""

    method: Annotated[
        Method,
        _circuit_option(
            "--method",
            "atp: attribution patching of heads and MLPs; eap: of edges (each head's query, key and value input "
            "apart); eap-ig: of edges with integrated gradients. Example: --method eap-ig",
            parser=choice_parser(Method, "method"),
        ),
    ] = "eap"
    metric: Annotated[
        Metric,
        _circuit_option(
            "--metric",
            "logit-diff: logit(answer) − logit(wrong) at the answer position; kl: KL divergence from the clean "
            "run's next-token distribution. Example: --metric kl",
            parser=choice_parser(Metric, "metric"),
        ),
    ] = "logit-diff"
    steps: Annotated[
        int,
        _circuit_option("--steps", "Integrated-gradient steps of --method eap-ig. Example: --steps 10", min=1),
    ] = 5
    per_position: Annotated[
        bool,
        _circuit_option("--per-position", "Also keep each position's score (in the JSON). Example: --per-position"),
    ] = False
    verify: Annotated[
        int,
        _circuit_option(
            "--verify",
            "Also measure the top K edges (nodes for atp) exactly by path patching and report the agreement. "
            "Example: --verify 20",
            min=0,
        ),
    ] = 0
    target: Annotated[
        float,
        _circuit_option("--target", "The faithfulness the smallest circuit must reach (0 to 1). Example: --target 0.9"),
    ] = 0.8

    def arguments(self) -> dict[str, Any]:
        """``method=…, metric=…, steps=…, per_position=…, verify=…, target=…`` as ``find_circuit`` takes them."""
        return {**dataclasses.asdict(self), "method": self.method.value, "metric": self.metric.value}


CIRCUIT_SEARCH: Any = OptionGroup(CircuitSearch)


@expand_option_groups
def circuit(
    checkpoint: Annotated[
        str,
        typer.Argument(
            help="Model spec: 'smollm2' (default), a pre-norm causal LM directory (LLaMA-style or GPT-2), a hub id in "
            "the local cache, or an attnviz toy checkpoint. Example: smollm2"
        ),
    ] = "smollm2",
    prompts: PromptPair = PROMPT_PAIR,
    pairs: option(
        Path | None,
        "--pairs",
        help='Prompt pairs instead of one: JSON Lines, one {"clean", "corrupt", "answer", "wrong"} a line; '
        "scores are averaged over them. Example: --pairs ioi.jsonl",
        panel=INPUT_PANEL,
        show_default=False,
    ) = None,
    search: CircuitSearch = CIRCUIT_SEARCH,
    edges: Annotated[
        str,
        _circuit_option("--edges", "Top edges written to the JSON: a number, or all. Example: --edges all"),
    ] = "200",
    batching: BatchOptions = BATCH_OPTIONS,
    top: option(int, "--top", min=1, help="Top edges to list. Example: --top 20", panel=VIEW_PANEL) = 10,
    terminal: terminal_list_option("edges") = False,
    json_path: JsonOption = None,
    out: option(
        Path | None,
        "--out",
        "-o",
        help="Figure (.png, .svg, .pdf): the circuit drawn layer by layer beside its faithfulness curve; or a "
        "page (.html) with a slider for the edges kept where a click on a head opens its attention on the "
        "clean prompt. Example: --out circuit.html",
        panel=OUTPUT_PANEL,
    ) = None,
) -> None:
    """Which heads feed which, through their queries, keys or values, so that the model gives this answer: edge attribution patching and faithful circuits.

    Every edge from a sender (the embeddings, a head, an MLP) to a receiver (a head's query, key or value input, an MLP, the logits) gets a score from one clean run and one corrupt run with gradients. Keeping the top edges and giving every other edge its corrupt value gives a circuit; its faithfulness (M_circuit − M_corrupt) / (M_clean − M_corrupt) is measured exactly, from the empty circuit (0) to the whole graph (1).

    Examples:

      attnviz circuit smollm2 --clean "When Mary and John went to the store, John gave a drink to" --corrupt "When Mary and John went to the store, Mary gave a drink to" --answer " Mary" --wrong " John" --out circuit.html

      attnviz circuit smollm2 --pairs ioi.jsonl --method eap-ig --steps 10 --verify 20 --json circuit.json

      torchrun --nproc-per-node 2 -m attnviz circuit smollm2 --pairs ioi.jsonl --json circuit.json
    """
    from attnviz.circuit import find_circuit, read_pairs
    from attnviz.cli.console import console
    from attnviz.cli.distributed import cli_session
    from attnviz.common.errors import InputError
    from attnviz.common.progress import status
    from attnviz.models.specs import load_model
    from attnviz.outputs.files import check_output_path
    from attnviz.render.html_page import HTML_SUFFIXES
    from attnviz.render.patch_plots import FIGURE_SUFFIXES

    if pairs is not None:
        given = [flag for flag, value in prompts.flags() if value]
        if given:
            raise InputError(f"give --pairs or {given[0]} and the rest of one pair, not both")
        chosen = read_pairs(pairs)
    else:
        missing = prompts.missing()
        if missing is not None:
            raise InputError(
                f"give {missing}: attnviz circuit needs --clean, --corrupt, --answer and --wrong (or --pairs)"
            )
        chosen = None
    listed = _edges(edges)
    if json_path is not None:
        check_output_path(json_path, (".json",))
    if out is not None:
        check_output_path(out, FIGURE_SUFFIXES + HTML_SUFFIXES)

    with cli_session(batching.device) as parallel:  # under torchrun each process takes its share of the pairs
        with status(f"loading {checkpoint}"):
            loaded = load_model(checkpoint, device=parallel.device_for(batching.device), dtype=batching.dtype)
        one = prompts.arguments() if chosen is None else {}
        result = find_circuit(
            loaded,
            **one,
            pairs=chosen,
            **search.arguments(),
            **batching.batching(),
            parallel=parallel,
        )
        if not parallel.is_main:  # only rank 0 prints and writes
            return
        written = []
        if json_path is not None:
            written.append(result.save_json(json_path, edges=listed))
        if out is not None:
            written.append(_write_view(loaded, result, out))
        for path in written:
            print(path)
        if terminal or not written:
            from attnviz.render.circuit_graph import top_table

            console.print(top_table(result, top=top))


def _edges(value: str) -> int | None:
    text = value.strip().lower()
    if text == "all":
        return None
    if text.isdigit():
        return int(text)
    from attnviz.common.errors import InputError

    raise InputError(f"--edges must be a number of edges or all, not {value!r}")


def _write_view(loaded, result, out: Path) -> Path:
    from attnviz.render.html_page import HTML_SUFFIXES

    if out.suffix.lower() in HTML_SUFFIXES:
        from attnviz.captures.attention_capture import capture
        from attnviz.render.circuit_page import write_circuit_page

        return write_circuit_page(out, result, capture(loaded, result.clean))
    from attnviz.render.circuit_graph import circuit_figure
    from attnviz.render.patch_plots import save_figure

    return save_figure(circuit_figure(result), out)


def register(app: typer.Typer) -> None:
    """Add this command to ``app``."""
    app.command("circuit")(circuit)
