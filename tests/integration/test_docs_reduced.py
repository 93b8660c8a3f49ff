"""The documented examples too slow for CI as written run here, reduced, so every command line the docs show runs in CI.

A ```bash block of README.md or docs/*.md preceded by ``<!-- ci-reduced: reason -->`` is skipped by
``test_docs_examples.py`` and run here instead: the block's own text, with the substitutions of its entry in
:data:`REDUCTIONS` (each must match the block, so an edited example cannot drift from what runs), after a set-up
that makes the inputs the block expects of the user. What each reduction changes is stated in its ``how``:
a shorter input, fewer texts, or a tiny model standing in. Everything else is checked as for every other example
(exit status 0, every named output written and valid) and commands shown being refused must leave their outputs
unwritten.

Only what the CI machine cannot run stays ``not-run`` (a GPU, several machines, the network, the set-up itself and
the test suite): :func:`test_only_what_ci_cannot_run_is_not_run` holds the reasons to that.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_docs_examples import EXAMPLES, ROOT, Example, run_example
from test_docs_examples import attnviz_cache as shared_attnviz_cache  # noqa: F401 (a fixture, by this name)

pytestmark = pytest.mark.slow

#: what a not-run reason may name: what the CI machine cannot run
_CANNOT_RUN_ON_CI = re.compile(r"GPU|several machines|two machines|network|set-up|test suite", re.IGNORECASE)
#: the shipped corpus run together into one long line (about 3,900 SmolLM2 tokens per copy)
_LONG_TEXT = "attnviz samples corpus-copy > /dev/null && for i in 1 2 3; do tr '\\n' ' ' < corpus-copy/corpus.txt; done > long.txt"


def _whisper_and_speech(folder: Path) -> None:
    """A tiny random Whisper with its processor as ``whisper-tiny/``, and ``speech.wav``."""
    from tiny_audio import build_tiny_whisper, write_wav

    build_tiny_whisper(folder / "whisper-tiny")
    write_wav(folder / "speech.wav")


def _vit_classifier_and_photos(folder: Path) -> None:
    """A tiny random ViT classifier as ``vit-classifier/``, eight generated pictures (the fewest pruning judges on) in
    ``photos/`` and ``heldout/``."""
    from tiny_vision import build_tiny_classifier, sample_images

    build_tiny_classifier("vit", folder / "vit-classifier")
    for name, seed in (("photos", 1), ("heldout", 2)):
        (folder / name).mkdir()
        for index, image in enumerate(sample_images(8, seed=seed, size=32)):
            image.save(folder / name / f"picture-{index}.png")


@dataclass(frozen=True)
class Reduction:
    """How CI runs one documented block: ``how`` in words, then the mechanics."""

    how: str
    #: (as documented, as run); each left side must occur in the block
    substitutions: tuple[tuple[str, str], ...] = ()
    #: bash run first in the same folder: the inputs the block expects of the user
    setup: str = ""
    #: Python run first with the folder: inputs bash cannot make (models, pictures)
    prepare: Callable[[Path], None] | None = None
    #: text the block must print on standard output
    prints: tuple[str, ...] = ()
    #: files that must hold these fragments afterwards
    holds: tuple[tuple[str, str], ...] = ()
    #: outputs named by commands shown being refused: they must not be written
    absent: tuple[str, ...] = ()


LONG_STATS = (
    "attnviz stats smollm2 --text-file long.txt --max-length 8192 --by-position --json stats.json --csv stats.csv "
    "--plot stats.png"
)
BOOK_STATS = LONG_STATS.replace("long.txt", "book.txt")
#: docs/long-context.md's book.txt: the shipped corpus three times over as one line (11,764 SmolLM2 tokens)
_BOOK = "for i in 1 2 3; do tr '\\n' ' ' < sample_data/corpus.txt; done > book.txt"
LONG_VIEW = (
    "cat sample_data/corpus.txt sample_data/corpus.txt | attnviz heatmap - --model smollm2 --max-length 4096 "
    "--out long.html"
)
VIT_PRUNE = "attnviz prune ./vit-classifier --images photos/ --eval-images heldout/ --ratio 0.25 --out pruned-vit"
WHISPER = 'attnviz heatmap --audio speech.wav --model openai/whisper-tiny --target " Hello there." --out hello.png'
LAYER_REFUSAL = 'attnviz heatmap "The cat sat" --model toy-copy --layer "0,,1" --out cat.png || echo "exit code $?"'

#: (document, first line of the block) -> its reduction
REDUCTIONS: dict[tuple[str, str], Reduction] = {
    ("docs/long-context.md", _BOOK): Reduction(
        how="the refusal as written (SmolLM2, 8,192 tokens); the one-layer capture on 1,024 tokens instead of 8,192",
        setup="attnviz samples > /dev/null",
        substitutions=(
            (
                "--bits 8 --out all.safetensors < book.txt",
                '--bits 8 --out all.safetensors < book.txt 2> refusal.txt || echo "exit code $?"',
            ),
            ("--max-length 8192 --layer 3", "--max-length 1024 --layer 3"),
        ),
        prints=("exit code 2",),
        holds=(
            (
                "refusal.txt",
                (
                    "error: this capture would hold 72.5 GB of attention weights (270 heads at 8,192 tokens, float32), "
                    "more than --max-bytes 4.0 GB: record fewer layers or heads (--layer, --head), give a shorter input "
                    "(--max-length), or raise --max-bytes (after: 1 text longer than 8192 tokens was truncated to 8192)"
                ),
            ),
        ),
        absent=("all.safetensors",),
    ),
    ("docs/long-context.md", BOOK_STATS): Reduction(
        how="the first 512 tokens of book.txt instead of 8,192",
        setup="attnviz samples > /dev/null && " + _BOOK,
        substitutions=(("--max-length 8192", "--max-length 512"),),
    ),
    (
        "docs/stats.md",
        LONG_STATS,
    ): Reduction(
        how="512 tokens of the shipped corpus run together instead of 8,192 tokens of your own",
        setup=_LONG_TEXT,
        substitutions=(("--max-length 8192", "--max-length 512"),),
    ),
    ("docs/long-context.md", "python benchmarks/bench_stats_long.py --tokens 2048,4096,8192 --rounds 3 --threads 1"): (
        Reduction(
            how="one round at 256 tokens instead of three at 2,048, 4,096 and 8,192",
            substitutions=(
                ("python benchmarks/", f"python {ROOT}/benchmarks/"),
                ("--tokens 2048,4096,8192 --rounds 3", "--tokens 256 --rounds 1"),
            ),
            prints=("by-position",),
        )
    ),
    ("docs/stats.md", "# one machine, two processes"): Reduction(
        how="two processes (gloo on the CPU) on 6 sentences of the corpus and 2 of the notes instead of all of them",
        setup="attnviz samples few > /dev/null && head -n 6 few/corpus.txt > few.txt && head -n 2 few/notes.txt > two.txt",
        substitutions=(
            ("--data sample_data/corpus.txt --json stats.json", "--data few.txt --json stats.json"),
            ("--data sample_data/notes.txt --out pruned", "--data two.txt --out pruned"),
        ),
    ),
    ("docs/views.md", LONG_VIEW): Reduction(
        how="256 tokens instead of 4,096",
        setup="attnviz samples > /dev/null",
        substitutions=(("--max-length 4096", "--max-length 256"),),
    ),
    ("docs/prune.md", VIT_PRUNE): Reduction(
        how="a tiny random ViT classifier stands in for ./vit-classifier, eight generated pictures for each folder",
        prepare=_vit_classifier_and_photos,
    ),
    ("docs/models.md", WHISPER): Reduction(
        how="a tiny random Whisper (2 + 2 layers) in ./whisper-tiny stands in for openai/whisper-tiny; a generated "
        "one-second wav with a tone burst for speech.wav",
        prepare=_whisper_and_speech,
        substitutions=(("--model openai/whisper-tiny", "--model ./whisper-tiny"),),
    ),
    ("docs/reliability.md", LAYER_REFUSAL): Reduction(
        how="as written: it must be refused with exit code 2 and write nothing",
        prints=("exit code 2",),
        absent=("cat.png",),
    ),
}


def _key(example: Example) -> tuple[str, str]:
    return str(example.document.relative_to(ROOT)), example.script.strip().splitlines()[0].strip()


REDUCED = [example for example in EXAMPLES if example.reduced is not None]


def reduced_script(example: Example, reduction: Reduction) -> str:
    """The block's text with the reduction's substitutions, each of which must match."""
    script = example.script
    for documented, run in reduction.substitutions:
        assert documented in script, f"{example.name}: the reduction expects {documented!r} in the block"
        script = script.replace(documented, run)
    return script


@pytest.mark.parametrize("example", REDUCED, ids=lambda example: example.name)
def test_slow_example_runs_reduced(example, tmp_path, shared_attnviz_cache):  # noqa: F811 (the fixture)
    reduction = REDUCTIONS[_key(example)]
    script = reduced_script(example, reduction)
    if reduction.prepare is not None:
        reduction.prepare(tmp_path)
    if reduction.setup:
        run_example(f"{example.name} (set-up)", reduction.setup, tmp_path, shared_attnviz_cache)
    result = run_example(example.name, script, tmp_path, shared_attnviz_cache, absent=reduction.absent)
    for text in reduction.prints:
        assert text in result.stdout, f"{example.name}: {text!r} not printed:\n{result.stdout[-2000:]}"
    for name, fragment in reduction.holds:
        content = " ".join((tmp_path / name).read_text(encoding="utf-8").split())
        assert fragment in content, f"{example.name}: {name} lacks {fragment!r}:\n{content}"


def test_every_reduced_example_has_its_reduction():
    """A ``ci-reduced`` block without an entry here (or an entry whose block is gone) fails, naming it."""
    assert sorted(map(_key, REDUCED)) == sorted(REDUCTIONS)
    for example in REDUCED:
        reduced_script(example, REDUCTIONS[_key(example)])


def test_only_what_ci_cannot_run_is_not_run():
    """Every other block runs in CI, as written or reduced: not-run is for a GPU, machines, the network, set-up."""
    skipped = {example.name: example.skip for example in EXAMPLES if example.skip is not None}
    assert skipped  # the README's set-up commands
    wrong = {name: reason for name, reason in skipped.items() if not _CANNOT_RUN_ON_CI.search(reason)}
    assert not wrong, f"not-run for a reason CI could handle (mark it ci-reduced and reduce it here): {wrong}"


def test_reduced_examples_name_the_reduction_in_the_docs():
    """The docs say why a block is reduced; the reduction itself is stated here, one sentence each."""
    for example in REDUCED:
        assert example.reduced and REDUCTIONS[_key(example)].how
