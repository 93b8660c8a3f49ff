"""A model spec that names nothing here is refused at once, with the closest names, and never reaches the network.

The commands run as fresh processes WITHOUT ``HF_HUB_OFFLINE``, with the Hugging Face endpoint pointed at a
loopback port where a listener counts connections: any network attempt (a download, a HEAD request, a retry)
shows up as a connection. How fast the refusal comes is measured by ``benchmarks/bench_model_lookup.py``.
"""

from __future__ import annotations

import shutil
import socket
import threading
from pathlib import Path

import pytest
from cli_helpers import assert_clean_error, run_cli

from attnviz.common.errors import ModelSpecError
from attnviz.models.lookup import check_model_spec, closest_names

SENTENCE = "The cat sat."


class ConnectionCounter:
    """A TCP listener on a loopback port that counts (and at once closes) every connection made to it."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.connections = 0
        self.running = True
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.getsockname()[1]}"

    def _serve(self) -> None:
        while self.running:
            try:
                connection, _ = self.server.accept()
            except OSError:  # the timeout: look at self.running again
                continue
            self.connections += 1
            connection.close()

    def close(self) -> None:
        self.running = False
        self.thread.join()
        self.server.close()


@pytest.fixture
def network(tmp_path):
    """The environment of a child with no HF_HUB_OFFLINE, a counted endpoint and an empty hub cache of its own."""
    counter = ConnectionCounter()
    hub = tmp_path / "hub"
    hub.mkdir()
    environment = {"HF_HUB_OFFLINE": None, "HF_ENDPOINT": counter.url, "HF_HUB_CACHE": str(hub), "HF_HOME": None}
    yield counter, environment, hub
    counter.close()


def _cache_as_hub_id(model_dir: Path, hub: Path, hub_id: str) -> None:
    """Lay ``model_dir`` out in ``hub`` as huggingface_hub caches a download of ``hub_id`` (refs/main → snapshot)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repository = hub / f"models--{hub_id.replace('/', '--')}"
    shutil.copytree(model_dir, repository / "snapshots" / commit)
    (repository / "refs").mkdir()
    (repository / "refs" / "main").write_text(commit)


@pytest.mark.parametrize(
    ("typo", "suggestion"),
    [("minlm", "minilm"), ("smolm2", "smollm2"), ("toy-inductoin", "toy-induction"), ("bert-base-uncased", None)],
)
def test_a_misspelled_model_is_refused_with_the_closest_names_and_no_network(network, tmp_path, typo, suggestion):
    counter, environment, _ = network
    result = run_cli(
        None, "heatmap", SENTENCE, "--model", typo, "--out", tmp_path / "h.png", subprocess=True, env=environment
    )
    assert_clean_error(result, f"unknown model '{typo}'", "hf download")
    assert len(result.error_lines()) == 1 and result.stderr.strip() == result.error_lines()[0], result.stderr
    if suggestion:
        assert f"did you mean {suggestion}?" in result.stderr
    else:
        assert "did you mean" not in result.stderr and f"hf download {typo}" in result.stderr
    assert counter.connections == 0 and "Retry" not in result.stderr
    assert not (tmp_path / "h.png").exists()


def test_a_cached_hub_id_loads_from_the_cache_without_the_network(network, tmp_path, tiny_dirs):
    counter, environment, hub = network
    _cache_as_hub_id(tiny_dirs["gpt2"], hub, "acme/tiny-gpt2")
    out = tmp_path / "h.safetensors"
    result = run_cli(
        None, "capture", SENTENCE, "--model", "acme/tiny-gpt2", "--out", out, subprocess=True, env=environment
    )
    assert result.exit_code == 0, result.stderr
    assert "acme/tiny-gpt2 (causal) · 6 tokens" in result.stderr
    assert counter.connections == 0

    typo = run_cli(
        None, "capture", SENTENCE, "--model", "acme/tiny-gtp2", "--out", out, subprocess=True, env=environment
    )
    assert_clean_error(typo, "did you mean acme/tiny-gpt2?")
    assert counter.connections == 0


def test_the_library_refuses_the_same_specs_with_the_same_suggestions(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pruned-minilm").mkdir()
    assert closest_names("MinLM") == ["minilm"]
    with pytest.raises(ModelSpecError, match=r"did you mean \./pruned-minilm\?"):
        check_model_spec("./pruned-minlm")
    with pytest.raises(ModelSpecError, match=r"unknown model 'toy-revrese': did you mean toy-reverse\?"):
        check_model_spec("toy-revrese")
    for spec in ("minilm", "SmolLM2", "toy-sort", "./pruned-minilm", "pruned-minilm"):
        check_model_spec(spec)  # names something here: no error
