"""attnviz works when installed from a wheel, not only from a source checkout.

The wheel is built here (no network, no build isolation) and its file list checked against
what the commands read at run time: the default corpus, every shipped toy checkpoint, py.typed.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from attnviz.common.texts import default_corpus_path, read_examples, sample_data_path
from attnviz.models.specs import SHIPPED_TOYS, TOY_MARKER, shipped_toy_path

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory) -> set[str]:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("attnviz-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def test_wheel_ships_corpus_toys_and_py_typed(wheel_files):
    assert "attnviz/py.typed" in wheel_files
    from attnviz.core.kernel import SOURCES

    for source in SOURCES:  # the fused kernel is built from them at run time
        assert f"attnviz/core/{source}" in wheel_files
    # the scripts and styles that HTML pages inline
    for asset in (ROOT / "attnviz" / "render" / "html").iterdir():
        assert f"attnviz/render/html/{asset.name}" in wheel_files
    assert "attnviz/sample_data/corpus.txt" in wheel_files
    shipped = sample_data_path("toy")
    # every file of every shipped checkpoint (step series included) is in the wheel
    for folder in SHIPPED_TOYS.values():
        for file in (shipped / folder).rglob("*"):
            if file.is_file():
                assert f"attnviz/sample_data/toy/{file.relative_to(shipped).as_posix()}" in wheel_files


def test_shipped_data_is_read_through_the_package():
    assert default_corpus_path() == sample_data_path("corpus.txt")
    assert len(read_examples(default_corpus_path())) == 351
    for name in SHIPPED_TOYS:
        folder = shipped_toy_path(name)  # attnviz's toy transformers, or a transformers ViT (toy-odd-patch)
        assert (folder / TOY_MARKER).is_file() or (folder / "config.json").is_file(), folder


def test_shipped_toy_names_load():
    from attnviz.models.specs import load_model

    model = load_model("toy-reverse")
    assert model.name == "toy-reverse"
    assert set(model.stacks()) == {"encoder", "decoder", "cross"}
    assert (model.num_layers("cross"), model.num_heads("cross")) == (2, 4)
