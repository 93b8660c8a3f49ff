"""``attnviz prune``: score attention heads, remove the least important, write a smaller checkpoint."""

from __future__ import annotations

from pathlib import Path

import typer

from attnviz.cli.option_groups import PLACEMENT, TEXT_INPUTS, ModelPlacement, TextInputs, expand_option_groups
from attnviz.cli.options import (
    DIRECTORY_METAVAR,
    INPUT_PANEL,
    OUTPUT_PANEL,
    CheckpointArgument,
    MaxLengthOption,
    MaxTokensPerBatchOption,
    choice_enum,
    choice_option,
    option,
)
from attnviz.prune.choices import METHODS, SCOPES

ImportanceMethod = choice_enum("ImportanceMethod", METHODS)
Scope = choice_enum("Scope", SCOPES)

HOW_MUCH_PANEL = "How much to prune"
HOW_PANEL = "How to choose heads"
MEASURE_PANEL = "Measuring"


@expand_option_groups
def prune(
    checkpoint: CheckpointArgument = "minilm",
    out: option(
        Path | None,
        "--out",
        "-o",
        metavar=DIRECTORY_METAVAR,
        help="Directory for the pruned checkpoint (new or empty, or add --force). Example: --out pruned-minilm",
        panel=OUTPUT_PANEL,
        show_default=False,
    ) = None,
    ratio: option(
        float | None,
        "--ratio",
        help="Fraction of all heads to remove, between 0 and 1. Example: --ratio 0.3",
        panel=HOW_MUCH_PANEL,
        show_default=False,
    ) = None,
    count: option(
        int | None,
        "--count",
        help="Number of heads to remove (instead of --ratio). Example: --count 20",
        panel=HOW_MUCH_PANEL,
        show_default=False,
    ) = None,
    min_score: option(
        float | None,
        "--min-score",
        help="Stop before quality falls below this fraction of the original (perplexity: 1/ppl; accuracy; "
        "cosine similarity; agreement of image classes), checked after each step. Example: --min-score 0.9",
        panel=HOW_MUCH_PANEL,
        show_default=False,
    ) = None,
    importance: choice_option(
        ImportanceMethod,
        "--importance",
        "importance method",
        help="How heads are scored: gradient (Michel et al.), ablation, entropy, confidence or random. "
        "Example: --importance ablation",
        panel=HOW_PANEL,
    ) = "gradient",
    strategy: choice_option(
        Scope,
        "--strategy",
        "strategy",
        help="global (least important heads of the whole model) or per-layer (the same share from every "
        "layer). Example: --strategy per-layer",
        panel=HOW_PANEL,
    ) = "global",
    iterative: option(
        bool,
        "--iterative/--one-shot",
        help="Re-score the remaining heads after each of --steps steps (Michel et al.), or rank once. "
        "Example: --iterative",
        panel=HOW_PANEL,
    ) = False,
    steps: option(
        int | None,
        "--steps",
        min=1,
        help="Steps to reach the target (re-scoring with --iterative, checks with --min-score); default: "
        "steps of 10 percent of the heads, as Michel et al. Example: --steps 4",
        panel=HOW_PANEL,
        show_default=False,
    ) = None,
    seed: option(
        int,
        "--seed",
        help="Seed of random importance, encoder probes and toy task data. Example: --seed 1",
        panel=HOW_PANEL,
    ) = 0,
    inputs: TextInputs = TEXT_INPUTS,
    eval_data: option(
        Path | None,
        "--eval-data",
        help="Held-out text to measure quality on (default: the scoring text). Example: --eval-data heldout.txt",
        panel=INPUT_PANEL,
        show_default=False,
    ) = None,
    images_dir: option(
        Path | None,
        "--images",
        metavar=DIRECTORY_METAVAR,
        help="Vision classifiers: a folder of images (PNG, JPEG, …) to judge heads on; no labels needed, the "
        "model's own predictions are the target. Example: --images photos/",
        panel=INPUT_PANEL,
        show_default=False,
    ) = None,
    image: option(
        list[str] | None,
        "--image",
        metavar="<path>",
        help="Vision classifiers: one image to judge heads on (repeat it for more). Example: --image a.png",
        panel=INPUT_PANEL,
        show_default=False,
    ) = None,
    eval_images: option(
        Path | None,
        "--eval-images",
        metavar=DIRECTORY_METAVAR,
        help="Vision classifiers: a folder of held-out images to measure quality on (default: the scoring "
        "images). Example: --eval-images heldout/",
        panel=INPUT_PANEL,
        show_default=False,
    ) = None,
    batch_size: option(
        int | None,
        "--batch-size",
        min=1,
        help="Examples per forward pass (default: 8 texts, 16 images, 64 toy examples). Example: --batch-size 4",
        panel=INPUT_PANEL,
        show_default=False,
    ) = None,
    max_tokens_per_batch: MaxTokensPerBatchOption = None,
    toy_examples: option(
        int,
        "--toy-examples",
        min=1,
        help="Toy models (toy-odd-patch too): task examples drawn for scoring, and as many "
        "(another seed) for evaluation. Example: --toy-examples 512",
        panel=INPUT_PANEL,
    ) = 256,
    max_length: MaxLengthOption = 256,
    force: option(
        bool, "--force", help="Replace an existing non-empty --out directory. Example: --force", panel=OUTPUT_PANEL
    ) = False,
    json_path: option(
        Path | None,
        "--json",
        help="Also write the report as JSON. Example: --json prune-report.json",
        panel=OUTPUT_PANEL,
        show_default=False,
    ) = None,
    transformers_copy: option(
        bool,
        "--transformers-copy/--no-transformers-copy",
        help="Also write OUT/transformers-masked: a second checkpoint, as large as the model read (88 MB more "
        "for minilm), with zeroed head weights, that plain transformers loads. Example: --transformers-copy",
        panel=OUTPUT_PANEL,
    ) = False,
    latency_tokens: option(
        int,
        "--latency-tokens",
        min=1,
        help="Input length for the latency measurement (text models; a vision model is timed on one image). "
        "Example: --latency-tokens 512",
        panel=MEASURE_PANEL,
    ) = 256,
    latency_repeats: option(
        int,
        "--latency-repeats",
        min=1,
        help="Rounds of timing: each times both models once, in alternation; the fastest round of each "
        "is reported with the range, and a difference only when the rounds agree on it. "
        "Example: --latency-repeats 20",
        panel=MEASURE_PANEL,
    ) = 10,
    placement: ModelPlacement = PLACEMENT,
) -> None:
    """Remove the least important attention heads and write a physically smaller checkpoint.

    Heads are judged on text (default: the shipped corpus), a toy's own task, or images (image classifiers).

    Examples:

      attnviz prune minilm --ratio 0.3 --out pruned-minilm

      attnviz prune smollm2 --count 54 --iterative --data notes.txt --out pruned-smollm2 --json report.json

      attnviz prune toy-induction --min-score 0.95 --importance ablation --out pruned-toy

      attnviz prune ./vit-classifier --images photos/ --eval-images heldout/ --ratio 0.25 --out pruned-vit

      torchrun --standalone --nproc-per-node 2 -m attnviz prune smollm2 --ratio 0.2 --data notes.txt --out pruned
    """
    from attnviz.cli.console import console
    from attnviz.common.errors import InputError
    from attnviz.common.texts import load_texts
    from attnviz.outputs.files import check_output_path
    from attnviz.prune.export import importance_table, summary_lines, summary_table, write_report_json
    from attnviz.prune.pipeline import PruneConfig, prune_checkpoint
    from attnviz.prune.strategy import PruneStrategy

    if out is None:
        raise InputError("say where to write the pruned checkpoint: --out DIR")
    config = PruneConfig(
        ratio=ratio,
        count=count,
        importance=importance.value,
        strategy=PruneStrategy(scope=strategy.value, iterative=iterative, steps=steps, min_score=min_score),
        seed=seed,
        batch_size=batch_size,
        max_tokens_per_batch=max_tokens_per_batch,
        max_length=max_length,
        toy_examples=toy_examples,
        latency_tokens=latency_tokens,
        latency_repeats=latency_repeats,
    )
    if json_path is not None:
        json_path = check_output_path(json_path, (".json",))
        if json_path.resolve().is_relative_to(out.expanduser().resolve()):
            raise InputError(f"--json {json_path} lies inside --out {out}: write the report elsewhere")
    from attnviz.cli.images import images_from_options

    texts = inputs.texts()  # None: the shipped corpus (text models)
    eval_texts = load_texts(eval_data) if eval_data is not None else None
    images = images_from_options(images_dir, image)
    held_out_images = images_from_options(eval_images, None)

    with placement.session() as parallel:
        outcome = prune_checkpoint(
            checkpoint,
            out,
            config,
            texts=texts,
            eval_texts=eval_texts,
            images=images,
            eval_images=held_out_images,
            force=force,
            transformers_copy=transformers_copy,
            **placement.loading(),
            parallel=parallel,
        )
        if parallel.is_main:  # rank 0 reports
            written = [outcome.report.output, outcome.report.transformers_copy]
            if json_path is not None:
                written.append(str(write_report_json(outcome.report, json_path)))
            console.print(importance_table(outcome.report))
            console.print(summary_table(outcome.report))
            for line in summary_lines(outcome.report):
                console.print(line, highlight=False)
            for path in written:  # the product, on stdout: every path written
                if path is not None:
                    print(path)


def register(app: typer.Typer) -> None:
    """Add this command to ``app``."""
    app.command("prune", no_args_is_help=True)(prune)
