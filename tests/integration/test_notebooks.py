"""The notebooks in ``examples/`` run through a real Jupyter kernel, and what they show renders in Chromium.

Each notebook is executed with nbclient + ipykernel (the ``[notebook]`` extra) in an empty directory. Every
``text/html`` output is then put into a page of its own, as a notebook front end would, and opened in
headless Chromium: it must be one frame that renders its content (the text's tokens, for attention views),
with no console error and no request for anything but the page itself.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from inline_helpers import text_in_frame

pytestmark = pytest.mark.slow  # MiniLM, a kernel start per notebook

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOTEBOOKS = sorted(path.name for path in EXAMPLES.glob("*.ipynb"))
#: per notebook: a token every attention view of it must show, and text its printed output must hold
EXPECTED = {
    "01_quick_start.ipynb": ("cat", "torch.Size([13, 13]) 1.0"),
    "02_your_own_model.ipynb": ("fox", "largest difference from eager attention"),
    "03_statistics_and_head_functions.ipynb": (None, "previous-token score"),
    "04_pruning.ipynb": ("cat", "heads left of 72"),
}


def execute(name: str, directory: Path):
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("ipykernel")
    return run_book(nbformat.read(EXAMPLES / name, as_version=4), directory)


def run_book(book, directory: Path):
    """Execute ``book`` (an nbformat notebook) in a fresh kernel whose working directory is ``directory``."""
    nbclient = pytest.importorskip("nbclient")
    client = nbclient.NotebookClient(
        book, kernel_name="python3", timeout=600, resources={"metadata": {"path": str(directory)}}
    )
    client.execute()
    return book


def outputs(book, kind: str) -> list[tuple[str, dict]]:
    """``(text/plain, output)`` of every output of ``kind`` (a MIME type or ``"stream"``)."""
    found = []
    for cell in book.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if kind == "stream" and output["output_type"] == "stream" and output["name"] == "stdout":
                found.append((output["text"], output))
            elif kind in data:
                found.append((data.get("text/plain", ""), output))
    return found


#: what third-party progress looks like in a notebook: tqdm's warning without ipywidgets, transformers' bars
NOISE = ("IProgress", "TqdmWarning", "Writing model shards", "Loading weights")


def noise(book) -> list[str]:
    """Every stream output (stdout or stderr) that shows third-party progress rather than attnviz's own.

    A cell that loads with transformers itself follows the user's settings: the examples that do turn transformers'
    bars off (``transformers.logging.disable_progress_bar()``), so no cell of theirs may show any either.
    """
    streams = [o["text"] for cell in book.cells for o in cell.get("outputs", []) if o["output_type"] == "stream"]
    return [text for text in streams if any(marker in text for marker in NOISE)]


def test_every_example_notebook_is_tested():
    assert NOTEBOOKS == sorted(EXPECTED)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_and_its_html_renders(name, tmp_path, open_page):
    book = execute(name, tmp_path)
    errors = [o for cell in book.cells for o in cell.get("outputs", []) if o["output_type"] == "error"]
    assert errors == []
    assert noise(book) == []
    token, printed = EXPECTED[name]
    assert printed in "".join(text for text, _ in outputs(book, "stream")) + "".join(
        text for text, _ in outputs(book, "text/plain")
    )
    shown = outputs(book, "text/html")
    assert shown, "the notebook displays nothing inline"
    for index, (plain, output) in enumerate(shown):
        fragment = output["data"]["text/html"]
        assert fragment.startswith("<iframe srcdoc="), plain
        text = text_in_frame(open_page, tmp_path / f"output-{index}.html", fragment)
        assert len(text) > 40, plain
        attention = plain.startswith("AttentionCapture") or "attention: " in plain
        if attention and token is not None and "BART" not in plain:
            assert token in text, (plain, text[:300])
    for _, output in outputs(book, "image/png"):  # figures show as PNG without pyplot
        assert base64.b64decode(output["data"]["image/png"]).startswith(b"\x89PNG")
    if name == "01_quick_start.ipynb":
        assert outputs(book, "image/png"), "the heatmap figure is not shown"
        assert (tmp_path / "cat-model-view.html").is_file()


def test_a_notebook_sees_attnviz_progress_only_and_keeps_its_own_settings(tiny_dirs, tmp_path):
    """Loading, pruning and saving a tiny model in a kernel without ipywidgets shows no tqdm warning and no
    transformers bar, and the kernel's transformers/huggingface_hub progress settings are as before the calls."""
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("ipykernel")
    source = str(tiny_dirs["bert"])
    calls = f"""import attnviz

loaded = attnviz.load_model({source!r}, device="cpu")
config = attnviz.PruneConfig(count=1, latency_tokens=8, latency_repeats=1)
outcome = attnviz.prune_model(loaded, config, texts=["The cat sat on the mat.", "A dog ran."])
attnviz.save_outcome(outcome, "pruned", source={source!r})
attnviz.load_model("pruned", device="cpu").layout() == outcome.pruned.layout()"""
    settings = """import huggingface_hub.utils
import transformers

print("bars on:", transformers.utils.logging.is_progress_bar_enabled(), huggingface_hub.utils.are_progress_bars_disabled() is False)
print("verbosity:", transformers.utils.logging.get_verbosity())"""
    book = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(calls), nbformat.v4.new_code_cell(settings)])
    run_book(book, tmp_path)
    errors = [o for cell in book.cells for o in cell.get("outputs", []) if o["output_type"] == "error"]
    assert errors == []
    assert outputs(book, "text/plain")[0][0] == "True"  # the saved checkpoint reads back with the pruned layout
    assert (tmp_path / "pruned").is_dir()
    assert noise(book) == []
    printed = "".join(text for text, _ in outputs(book, "stream"))
    assert "bars on: True True" in printed  # transformers' default, as before attnviz's calls
    assert "verbosity: 30" in printed  # logging.WARNING, transformers' default
