"""The fused statistics reductions (attnviz.stats.fused): same numbers as the eager passes, and a safe fallback."""

from __future__ import annotations

import pytest
import torch

from attnviz.stats import fused
from attnviz.stats.fused import row_reductions, set_fused_statistics

TEXTS = ["The cat sat on the mat because it was tired.", "Dogs bark.", "Paris is the capital of France, a city."]


@pytest.fixture(autouse=True)
def _restore_fused_state():
    yield
    set_fused_statistics(None)
    fused._failed = False


def test_row_reductions_match_the_eager_passes_on_a_masked_block():
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 3, 5, 7, generator=generator)  # [b, h, blk, c]
    scores[..., 4:] = -torch.inf  # a causal-style mask: keys 4.. hidden
    pattern = torch.softmax(scores, -1)
    positions = torch.arange(7, dtype=torch.float32).expand(2, 7)[:, None, None, :]  # [b, 1, 1, c]
    max_weight, weighted, max_score, mass, position_sum = row_reductions(pattern, scores, positions)
    assert weighted.dtype == position_sum.dtype == torch.float64  # the long weighted sums accumulate in float64
    weighted, position_sum = weighted.float(), position_sum.float()
    visible = scores[..., :4]
    assert torch.equal(max_weight, pattern.amax(-1))
    assert torch.allclose(weighted, (pattern[..., :4] * visible).sum(-1))  # 0·(−inf) counted as 0, not NaN
    assert torch.equal(max_score, scores.amax(-1))
    assert torch.allclose(mass, torch.ones_like(mass))
    assert torch.allclose(position_sum, (pattern * torch.arange(7.0)).sum(-1))
    entropy = (max_score - max_weight.log()) - weighted
    assert torch.allclose(entropy, -(pattern[..., :4] * pattern[..., :4].log()).sum(-1), atol=1e-6)


def test_fused_path_falls_back_to_eager_when_compilation_fails(tiny_model_dirs, monkeypatch):
    from attnviz.models.specs import load_model
    from attnviz.stats import compute_statistics

    loaded = load_model(str(tiny_model_dirs["llama"]), device="cpu")
    reference = compute_statistics(loaded, TEXTS, progress=False)

    def no_compiler(*args, **kwargs):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(fused, "_compiled", None)
    monkeypatch.setattr(torch, "compile", no_compiler)
    set_fused_statistics(True)
    fallback = compute_statistics(loaded, TEXTS, progress=False)
    assert fused._failed  # tried once, then stays on the eager reductions
    for name in reference.names:
        assert torch.equal(reference.matrix(name), fallback.matrix(name)), name


@pytest.mark.slow
def test_compiled_reductions_agree_with_eager_statistics(tiny_model_dirs):
    """Compiles with Inductor (a minute or more on a busy 2-core machine)."""
    from attnviz.models.specs import load_model
    from attnviz.stats import compute_statistics

    loaded = load_model(str(tiny_model_dirs["llama"]), device="cpu")
    reference = compute_statistics(loaded, TEXTS, progress=False)
    set_fused_statistics(True)
    compiled = compute_statistics(loaded, TEXTS, progress=False)
    if fused._failed:
        pytest.skip("torch.compile is unavailable here (the fallback is tested above)")
    assert fused._compiled is not None
    for name in reference.names:
        assert torch.allclose(reference.matrix(name), compiled.matrix(name), atol=1e-5, equal_nan=True), name
        assert torch.allclose(reference.std_matrix(name), compiled.std_matrix(name), atol=1e-5, equal_nan=True), name
